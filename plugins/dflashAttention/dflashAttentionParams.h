/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Arguments of one DFlash draft-attention call, shared by the CPU twin and the CUDA launcher.
 *
 *   q        [B, S, Hq, Dh]     block queries after q_norm, before RoPE
 *   k, v     [B, S, Hkv, Dh]    block keys (after k_norm, before RoPE) and values
 *   ctxK/V   [B, C, Hkv, Dh]    new context rows (after k_norm, before RoPE); rows >= ctxLens[b] are padding
 *   cacheK/V [B, Hkv, Cmax, Dh] persistent cache of RoPE'd keys / values; rows [cacheLens[b], cacheLens[b] +
 *                               ctxLens[b]) are written, rows before them are read
 *   cacheLens, ctxLens [B] int32
 *   out      [B, S, Hq, Dh]
 * Context row i of sequence b sits at absolute position cacheLens[b] + i, block slot j at
 * cacheLens[b] + ctxLens[b] + j. The block attends, without mask, to [cache rows 0..cacheLens[b]+ctxLens[b]) ; block].
 */
#ifndef DFLASH_ATTENTION_PARAMS_H
#define DFLASH_ATTENTION_PARAMS_H

#include "dflashAttentionConfig.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dflash
{

//! Element type of q, k, v, ctxK, ctxV, the cache and out (all the same).
enum class DataType : int32_t
{
    kFLOAT = 0,
    kHALF = 1,
    kBF16 = 2,
};

//! Bytes of one element of a DataType.
inline int32_t dataTypeSize(DataType type) noexcept
{
    return type == DataType::kFLOAT ? 4 : 2;
}

struct DflashAttentionParams
{
    void const* q;
    void const* k;
    void const* v;
    void const* ctxK;
    void const* ctxV;
    void* cacheK;
    void* cacheV;
    int32_t const* cacheLens;
    int32_t const* ctxLens;
    void* out;

    int32_t batch;         //!< B
    int32_t blockLen;      //!< S
    int32_t ctxRows;       //!< C (padded number of new context rows)
    int32_t cacheCapacity; //!< Cmax
    int32_t numHeads;      //!< Hq
    int32_t numKvHeads;    //!< Hkv
    int32_t headDim;       //!< Dh

    RopeTable rope;
    float softmaxScale; //!< Dh^-0.5
};

//! Fill the shape-independent part of the params from validated fields.
inline DflashAttentionParams makeParams(DflashAttentionFields const& fields)
{
    DflashAttentionParams p;
    std::memset(&p, 0, sizeof(p));
    p.numHeads = fields.numHeads;
    p.numKvHeads = fields.numKvHeads;
    p.headDim = fields.headDim;
    p.rope = computeRopeTable(fields);
    p.softmaxScale = 1.F / std::sqrt(static_cast<float>(fields.headDim));
    return p;
}

//! Host conversions of the 16-bit types (round to nearest even), so the CPU twin needs no compiler extension.
struct Bf16
{
    uint16_t bits;
};
struct Fp16
{
    uint16_t bits;
};

inline float toFloat(float x) noexcept
{
    return x;
}

inline float toFloat(Bf16 x) noexcept
{
    uint32_t const u = static_cast<uint32_t>(x.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

inline float toFloat(Fp16 x) noexcept
{
    uint32_t const sign = static_cast<uint32_t>(x.bits & 0x8000U) << 16;
    uint32_t const exponent = (x.bits >> 10) & 0x1FU;
    uint32_t mantissa = x.bits & 0x3FFU;
    uint32_t u;
    if (exponent == 0x1FU)
    {
        u = sign | 0x7F800000U | (mantissa << 13);
    }
    else if (exponent != 0)
    {
        u = sign | ((exponent + 112U) << 23) | (mantissa << 13);
    }
    else if (mantissa == 0)
    {
        u = sign;
    }
    else
    {
        // Subnormal half: normalise into a float.
        uint32_t e = 113U;
        while ((mantissa & 0x400U) == 0)
        {
            mantissa <<= 1;
            --e;
        }
        u = sign | (e << 23) | ((mantissa & 0x3FFU) << 13);
    }
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

template <typename T>
T fromFloat(float x) noexcept;

template <>
inline float fromFloat<float>(float x) noexcept
{
    return x;
}

template <>
inline Bf16 fromFloat<Bf16>(float x) noexcept
{
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    if ((u & 0x7FFFFFFFU) > 0x7F800000U)
    {
        return Bf16{static_cast<uint16_t>((u >> 16) | 0x40U)}; // quiet NaN
    }
    u += 0x7FFFU + ((u >> 16) & 1U);
    return Bf16{static_cast<uint16_t>(u >> 16)};
}

template <>
inline Fp16 fromFloat<Fp16>(float x) noexcept
{
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    uint16_t const sign = static_cast<uint16_t>((u >> 16) & 0x8000U);
    uint32_t const absBits = u & 0x7FFFFFFFU;
    if (absBits > 0x7F800000U)
    {
        return Fp16{static_cast<uint16_t>(sign | 0x7E00U)};
    }
    if (absBits >= 0x477FF000U) // rounds to >= 65520: overflow to infinity
    {
        return Fp16{static_cast<uint16_t>(sign | 0x7C00U)};
    }
    if (absBits < 0x38800000U) // below the smallest normal half: round in the subnormal grid
    {
        float absF;
        std::memcpy(&absF, &absBits, sizeof(absF));
        // 2^-24 is the subnormal step; rintf rounds half to even in the default rounding mode.
        float const steps = std::nearbyint(absF * 16777216.F);
        return Fp16{static_cast<uint16_t>(sign | static_cast<uint16_t>(steps))};
    }
    uint32_t const rounded = absBits + 0xFFFU + ((absBits >> 13) & 1U);
    return Fp16{static_cast<uint16_t>(sign | ((rounded - 0x38000000U) >> 13))};
}

} // namespace dflash

#endif // DFLASH_ATTENTION_PARAMS_H
