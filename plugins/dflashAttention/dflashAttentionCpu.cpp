/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionCpu.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace dflash
{
namespace
{

//! Rotate-half RoPE of one head row at an absolute position, in fp32 (the order of operations of the reference).
void applyRope(float* row, int32_t headDim, RopeTable const& rope, int64_t position)
{
    int32_t const half = headDim / 2;
    float const pos = static_cast<float>(position);
    for (int32_t i = 0; i < half; ++i)
    {
        float const angle = pos * rope.invFreq[i];
        float const c = std::cos(angle) * rope.attentionFactor;
        float const s = std::sin(angle) * rope.attentionFactor;
        float const x1 = row[i];
        float const x2 = row[i + half];
        row[i] = x1 * c - x2 * s;
        row[i + half] = x2 * c + x1 * s;
    }
}

//! Load one head row as fp32, optionally RoPE'd and rounded back through T (as the kernels store it).
template <typename T>
void loadRow(float* dst, T const* src, int32_t headDim, RopeTable const* rope, int64_t position)
{
    for (int32_t d = 0; d < headDim; ++d)
    {
        dst[d] = toFloat(src[d]);
    }
    if (rope != nullptr)
    {
        applyRope(dst, headDim, *rope, position);
        for (int32_t d = 0; d < headDim; ++d)
        {
            dst[d] = toFloat(fromFloat<T>(dst[d]));
        }
    }
}

//! Step 1: RoPE the new context keys and append keys and values to the cache.
template <typename T>
void appendContext(DflashAttentionParams const& p)
{
    int32_t const dh = p.headDim;
    std::vector<float> row(dh);
    for (int32_t b = 0; b < p.batch; ++b)
    {
        int32_t const start = p.cacheLens[b];
        for (int32_t i = 0; i < p.ctxLens[b]; ++i)
        {
            for (int32_t h = 0; h < p.numKvHeads; ++h)
            {
                int64_t const src = ((static_cast<int64_t>(b) * p.ctxRows + i) * p.numKvHeads + h) * dh;
                int64_t const dst = ((static_cast<int64_t>(b) * p.numKvHeads + h) * p.cacheCapacity + start + i) * dh;
                loadRow(row.data(), static_cast<T const*>(p.ctxK) + src, dh, &p.rope, start + i);
                T* cacheK = static_cast<T*>(p.cacheK) + dst;
                T* cacheV = static_cast<T*>(p.cacheV) + dst;
                T const* ctxV = static_cast<T const*>(p.ctxV) + src;
                for (int32_t d = 0; d < dh; ++d)
                {
                    cacheK[d] = fromFloat<T>(row[d]);
                    cacheV[d] = ctxV[d];
                }
            }
        }
    }
}

//! Step 2: attention of the block of one (sequence, KV head) over [cache ; block], for every query head of the group.
template <typename T>
void attendGroup(DflashAttentionParams const& p, int32_t b, int32_t kvHead)
{
    int32_t const dh = p.headDim;
    int32_t const group = p.numHeads / p.numKvHeads;
    int32_t const numCached = p.cacheLens[b] + p.ctxLens[b];
    int32_t const numKeys = numCached + p.blockLen;
    std::vector<float> keys(static_cast<size_t>(numKeys) * dh);
    std::vector<float> values(static_cast<size_t>(numKeys) * dh);
    int64_t const cacheBase = (static_cast<int64_t>(b) * p.numKvHeads + kvHead) * p.cacheCapacity * dh;
    for (int32_t j = 0; j < numCached; ++j)
    {
        loadRow(&keys[j * dh], static_cast<T const*>(p.cacheK) + cacheBase + j * dh, dh, nullptr, 0);
        loadRow(&values[j * dh], static_cast<T const*>(p.cacheV) + cacheBase + j * dh, dh, nullptr, 0);
    }
    for (int32_t j = 0; j < p.blockLen; ++j)
    {
        int64_t const src = ((static_cast<int64_t>(b) * p.blockLen + j) * p.numKvHeads + kvHead) * dh;
        loadRow(&keys[(numCached + j) * dh], static_cast<T const*>(p.k) + src, dh, &p.rope, numCached + j);
        loadRow(&values[(numCached + j) * dh], static_cast<T const*>(p.v) + src, dh, nullptr, 0);
    }

    std::vector<float> query(dh);
    std::vector<float> scores(numKeys);
    std::vector<float> acc(dh);
    for (int32_t s = 0; s < p.blockLen; ++s)
    {
        for (int32_t g = 0; g < group; ++g)
        {
            int64_t const qOffset = ((static_cast<int64_t>(b) * p.blockLen + s) * p.numHeads + kvHead * group + g) * dh;
            loadRow(query.data(), static_cast<T const*>(p.q) + qOffset, dh, &p.rope, numCached + s);
            float maxScore = -INFINITY;
            for (int32_t j = 0; j < numKeys; ++j)
            {
                float dot = 0.F;
                for (int32_t d = 0; d < dh; ++d)
                {
                    dot += query[d] * keys[j * dh + d];
                }
                scores[j] = dot * p.softmaxScale;
                maxScore = std::max(maxScore, scores[j]);
            }
            float sum = 0.F;
            std::fill(acc.begin(), acc.end(), 0.F);
            for (int32_t j = 0; j < numKeys; ++j)
            {
                float const weight = std::exp(scores[j] - maxScore);
                sum += weight;
                for (int32_t d = 0; d < dh; ++d)
                {
                    acc[d] += weight * values[j * dh + d];
                }
            }
            T* out = static_cast<T*>(p.out) + qOffset;
            for (int32_t d = 0; d < dh; ++d)
            {
                out[d] = fromFloat<T>(acc[d] / sum);
            }
        }
    }
}

} // namespace

std::string validateCall(DflashAttentionParams const& p)
{
    std::ostringstream os;
    os << kPLUGIN_NAME << ": ";
    if (p.batch < 1 || p.blockLen < 1 || p.ctxRows < 0 || p.cacheCapacity < 0)
    {
        os << "bad shapes: batch " << p.batch << ", block " << p.blockLen << ", context rows " << p.ctxRows
           << ", cache capacity " << p.cacheCapacity;
        return os.str();
    }
    for (int32_t b = 0; b < p.batch; ++b)
    {
        int64_t const cached = p.cacheLens[b];
        int64_t const added = p.ctxLens[b];
        if (cached < 0 || added < 0 || added > p.ctxRows || cached + added > p.cacheCapacity)
        {
            os << "sequence " << b << ": cache_len " << cached << " + ctx_len " << added
               << " does not fit (context rows " << p.ctxRows << ", cache capacity " << p.cacheCapacity << ")";
            return os.str();
        }
    }
    return {};
}

template <typename T>
std::string dflashAttentionCpu(DflashAttentionParams const& p)
{
    std::string error = validateCall(p);
    if (!error.empty())
    {
        return error;
    }
    appendContext<T>(p);
    for (int32_t b = 0; b < p.batch; ++b)
    {
        for (int32_t h = 0; h < p.numKvHeads; ++h)
        {
            attendGroup<T>(p, b, h);
        }
    }
    return {};
}

template std::string dflashAttentionCpu<float>(DflashAttentionParams const&);
template std::string dflashAttentionCpu<Fp16>(DflashAttentionParams const&);
template std::string dflashAttentionCpu<Bf16>(DflashAttentionParams const&);

std::string dflashAttentionCpu(DflashAttentionParams const& params, DataType type)
{
    switch (type)
    {
    case DataType::kFLOAT: return dflashAttentionCpu<float>(params);
    case DataType::kHALF: return dflashAttentionCpu<Fp16>(params);
    case DataType::kBF16: return dflashAttentionCpu<Bf16>(params);
    }
    return std::string(kPLUGIN_NAME) + ": unsupported data type";
}

} // namespace dflash
