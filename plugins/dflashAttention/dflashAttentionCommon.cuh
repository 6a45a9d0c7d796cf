/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Device code shared by the attention kernels: conversions, RoPE, lengths, the workspace, prepareKernel and
 * combineKernel.
 * Included by dflashAttentionKernel.cu only (internal linkage).
 */
#ifndef DFLASH_ATTENTION_COMMON_CUH
#define DFLASH_ATTENTION_COMMON_CUH

#include "dflashAttentionKernel.h"

#include <cmath>
#include <cstdint>

namespace dflash
{
namespace
{

constexpr float kLOG2E{1.4426950408889634F};

// ---------------------------------------------------------------------------------------------------------------------
// Element conversions

__device__ __forceinline__ float toF(float x)
{
    return x;
}
__device__ __forceinline__ float toF(__half x)
{
    return __half2float(x);
}
__device__ __forceinline__ float toF(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T fromF(float x);
template <>
__device__ __forceinline__ float fromF<float>(float x)
{
    return x;
}
template <>
__device__ __forceinline__ __half fromF<__half>(float x)
{
    return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromF<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

//! Two floats rounded to T and packed into one 32-bit register (first in the low half, as mma fragments expect);
//! `lo`/`hi` receive the rounded values back in fp32.
template <typename T>
__device__ __forceinline__ uint32_t packRounded(float a, float b, float& lo, float& hi)
{
    T const ra = fromF<T>(a);
    T const rb = fromF<T>(b);
    lo = toF(ra);
    hi = toF(rb);
    uint16_t const ua = *reinterpret_cast<uint16_t const*>(&ra);
    uint16_t const ub = *reinterpret_cast<uint16_t const*>(&rb);
    return static_cast<uint32_t>(ua) | (static_cast<uint32_t>(ub) << 16);
}

// ---------------------------------------------------------------------------------------------------------------------
// RoPE and lengths (shared by both attention kernels)

//! cos/sin of pair i at an absolute position, times the attention factor (the order of operations of the reference).
__device__ __forceinline__ void ropeAngle(RopeTable const& table, int32_t i, int32_t position, float& c, float& s)
{
    float const angle = __fmul_rn(static_cast<float>(position), table.invFreq[i]);
    sincosf(angle, &s, &c);
    c = __fmul_rn(c, table.attentionFactor);
    s = __fmul_rn(s, table.attentionFactor);
}

//! Rotate-half RoPE of the pair (x[i], x[i + Dh/2]) written to y, rounded to T as the reference rounds it.
template <typename T, int32_t DH>
__device__ __forceinline__ void ropePair(T const* x, T* y, int32_t i, float c, float s)
{
    float const x1 = toF(x[i]);
    float const x2 = toF(x[i + DH / 2]);
    y[i] = fromF<T>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    y[i + DH / 2] = fromF<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

__device__ __forceinline__ int32_t clampedStart(DflashAttentionParams const& p, int32_t b)
{
    return min(max(p.cacheLens[b], 0), p.cacheCapacity);
}

//! Cached rows the block attends to (old + new context), clamped so a bad length never leaves the cache.
__device__ __forceinline__ int32_t cachedRows(DflashAttentionParams const& p, int32_t b)
{
    int32_t const added = min(max(p.ctxLens[b], 0), p.ctxRows);
    return min(clampedStart(p, b) + added, p.cacheCapacity);
}

//! Device pointers of the workspace regions.
struct Workspace
{
    void* ropedQ;
    void* ropedK;
    float* partialAcc;
    float* partialStats;
    int32_t maxSplits;
};

//! grid (C + S, Hkv, B), block Dh/2. Rows < C: RoPE the new context keys and append keys and values to the cache.
//! Rows >= C (block slot j): RoPE the block key and the G queries of the group at position cachedRows + j into the
//! workspace, once, so the attention CTAs of every split read them ready-made.
template <typename T, int32_t DH>
__global__ void prepareKernel(DflashAttentionParams const p, Workspace const ws)
{
    int32_t const row = blockIdx.x;
    int32_t const head = blockIdx.y;
    int32_t const b = blockIdx.z;
    int32_t const i = threadIdx.x;
    float c;
    float s;
    if (row < p.ctxRows)
    {
        int32_t const start = clampedStart(p, b);
        if (row >= min(max(p.ctxLens[b], 0), p.ctxRows) || start + row >= p.cacheCapacity)
        {
            return;
        }
        size_t const src = ((static_cast<size_t>(b) * p.ctxRows + row) * p.numKvHeads + head) * DH;
        size_t const dst = ((static_cast<size_t>(b) * p.numKvHeads + head) * p.cacheCapacity + start + row) * DH;
        T const* ctxV = static_cast<T const*>(p.ctxV) + src;
        T* cacheV = static_cast<T*>(p.cacheV) + dst;
        ropeAngle(p.rope, i, start + row, c, s);
        ropePair<T, DH>(static_cast<T const*>(p.ctxK) + src, static_cast<T*>(p.cacheK) + dst, i, c, s);
        cacheV[i] = ctxV[i];
        cacheV[i + DH / 2] = ctxV[i + DH / 2];
        return;
    }
    int32_t const slot = row - p.ctxRows;
    int32_t const group = p.numHeads / p.numKvHeads;
    ropeAngle(p.rope, i, cachedRows(p, b) + slot, c, s);
    size_t const kSrc = ((static_cast<size_t>(b) * p.blockLen + slot) * p.numKvHeads + head) * DH;
    size_t const kDst = ((static_cast<size_t>(b) * p.numKvHeads + head) * p.blockLen + slot) * DH;
    ropePair<T, DH>(static_cast<T const*>(p.k) + kSrc, static_cast<T*>(ws.ropedK) + kDst, i, c, s);
    for (int32_t g = 0; g < group; ++g)
    {
        size_t const qSrc = ((static_cast<size_t>(b) * p.blockLen + slot) * p.numHeads + head * group + g) * DH;
        size_t const qDst = ((static_cast<size_t>(b) * p.numKvHeads + head) * group * p.blockLen + slot * group + g) * DH;
        ropePair<T, DH>(static_cast<T const*>(p.q) + qSrc, static_cast<T*>(ws.ropedQ) + qDst, i, c, s);
    }
}

//! Keys [keyBegin, keyEnd) of the CTA's split; returns false when the sequence has fewer splits than this index.
__device__ __forceinline__ bool splitRange(
    DflashAttentionParams const& p, int32_t b, int32_t split, int32_t& numCached, int32_t& keyBegin, int32_t& keyEnd)
{
    numCached = cachedRows(p, b);
    int32_t const numKeys = numCached + p.blockLen;
    if (split >= numSplitsForKeys(numKeys))
    {
        return false;
    }
    keyBegin = split * kKEYS_PER_SPLIT;
    keyEnd = min(numKeys, keyBegin + kKEYS_PER_SPLIT);
    return true;
}

//! Output row of query row r of the group (block slot r / G, head kvHead * G + r % G).
__device__ __forceinline__ size_t outputRow(DflashAttentionParams const& p, int32_t b, int32_t kvHead, int32_t r)
{
    int32_t const group = p.numHeads / p.numKvHeads;
    return (static_cast<size_t>(b) * p.blockLen + r / group) * p.numHeads + kvHead * group + r % group;
}

// ---------------------------------------------------------------------------------------------------------------------
// Combine and launch

//! grid (B x S x Hq), block Dh: merge the splits, in split order, of one query row of a sequence with several splits
//! (rows of single-split sequences were written by the attention kernel).
template <typename T, int32_t DH>
__global__ void combineKernel(DflashAttentionParams const p, Workspace const ws)
{
    size_t const row = blockIdx.x;
    int32_t const b = static_cast<int32_t>(row / (static_cast<size_t>(p.blockLen) * p.numHeads));
    int32_t const numSplits = numSplitsForKeys(cachedRows(p, b) + p.blockLen);
    if (numSplits == 1)
    {
        return;
    }
    size_t const numQueryRows = static_cast<size_t>(p.batch) * p.blockLen * p.numHeads;
    int32_t const d = threadIdx.x;
    float globalMax = -INFINITY;
    for (int32_t s = 0; s < numSplits; ++s)
    {
        globalMax = fmaxf(globalMax, ws.partialStats[(s * numQueryRows + row) * 2]);
    }
    float sum = 0.F;
    float acc = 0.F;
    for (int32_t s = 0; s < numSplits; ++s)
    {
        size_t const partialRow = s * numQueryRows + row;
        float const weight = exp2f(ws.partialStats[partialRow * 2] - globalMax);
        sum += weight * ws.partialStats[partialRow * 2 + 1];
        acc += weight * ws.partialAcc[partialRow * DH + d];
    }
    static_cast<T*>(p.out)[row * DH + d] = fromF<T>(acc / sum);
}

} // namespace
} // namespace dflash

#endif // DFLASH_ATTENTION_COMMON_CUH
