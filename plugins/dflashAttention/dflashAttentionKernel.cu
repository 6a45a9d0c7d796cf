/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionKernel.h"

#include <algorithm>
#include <cmath>

namespace dflash
{
namespace
{

constexpr int32_t kTHREADS{128};
constexpr int32_t kWARPS{kTHREADS / 32};
constexpr float kLOG2E{1.4426950408889634F};

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

//! Rotate-half RoPE of the pair (x1 at i, x2 at i + Dh/2), rounded through T as the CPU twin does.
template <typename T>
__device__ __forceinline__ void rope(float& x1, float& x2, RopeTable const& table, int32_t i, int32_t position)
{
    float const angle = static_cast<float>(position) * table.invFreq[i];
    float s;
    float c;
    sincosf(angle, &s, &c);
    c *= table.attentionFactor;
    s *= table.attentionFactor;
    float const r1 = x1 * c - x2 * s;
    float const r2 = x2 * c + x1 * s;
    x1 = toF(fromF<T>(r1));
    x2 = toF(fromF<T>(r2));
}

//! Number of cached rows the block attends to, clamped so a bad length never leaves the cache.
__device__ __forceinline__ int32_t cachedRows(DflashAttentionParams const& p, int32_t b)
{
    int32_t const start = min(max(p.cacheLens[b], 0), p.cacheCapacity);
    int32_t const added = min(max(p.ctxLens[b], 0), p.ctxRows);
    return min(start + added, p.cacheCapacity);
}

//! grid (C, Hkv, B), block Dh/2: RoPE the new context keys and write keys and values into the cache.
template <typename T, int32_t DH>
__global__ void appendContextKernel(DflashAttentionParams const p)
{
    int32_t const row = blockIdx.x;
    int32_t const head = blockIdx.y;
    int32_t const b = blockIdx.z;
    int32_t const i = threadIdx.x;
    int32_t const start = min(max(p.cacheLens[b], 0), p.cacheCapacity);
    if (row >= min(p.ctxLens[b], p.ctxRows) || start + row >= p.cacheCapacity)
    {
        return;
    }
    size_t const src = ((static_cast<size_t>(b) * p.ctxRows + row) * p.numKvHeads + head) * DH;
    size_t const dst = ((static_cast<size_t>(b) * p.numKvHeads + head) * p.cacheCapacity + start + row) * DH;
    T const* ctxK = static_cast<T const*>(p.ctxK) + src;
    T const* ctxV = static_cast<T const*>(p.ctxV) + src;
    T* cacheK = static_cast<T*>(p.cacheK) + dst;
    T* cacheV = static_cast<T*>(p.cacheV) + dst;
    float x1 = toF(ctxK[i]);
    float x2 = toF(ctxK[i + DH / 2]);
    rope<T>(x1, x2, p.rope, i, start + row);
    cacheK[i] = fromF<T>(x1);
    cacheK[i + DH / 2] = fromF<T>(x2);
    cacheV[i] = ctxV[i];
    cacheV[i + DH / 2] = ctxV[i + DH / 2];
}

//! Shared-memory layout of attentionKernel (floats).
template <int32_t DH>
struct SmemLayout
{
    static constexpr int32_t kROWS = kMAX_ROW_ELEMENTS / DH;
    static constexpr int32_t kKV_STRIDE = DH + 1; // +1 keeps the per-key column reads conflict-free
    static constexpr int32_t kQ = 0;
    static constexpr int32_t kACC = kQ + kROWS * DH;
    static constexpr int32_t kK = kACC + kROWS * DH;
    static constexpr int32_t kV = kK + kKEY_TILE * kKV_STRIDE;
    static constexpr int32_t kS = kV + kKEY_TILE * kKV_STRIDE;
    static constexpr int32_t kM = kS + kROWS * kKEY_TILE;
    static constexpr int32_t kL = kM + kROWS;
    static constexpr int32_t kALPHA = kL + kROWS;
    static constexpr size_t kBYTES = sizeof(float) * (kALPHA + kROWS);
};

//! Load one key/value tile (cache rows, then RoPE'd block rows, then zero padding) into shared memory.
template <typename T, int32_t DH>
__device__ void loadKeyValueTile(DflashAttentionParams const& p, float* sK, float* sV, int32_t b, int32_t kvHead,
    int32_t keyBase, int32_t numCached, int32_t numKeys)
{
    using L = SmemLayout<DH>;
    T const* cacheK = static_cast<T const*>(p.cacheK) + (static_cast<size_t>(b) * p.numKvHeads + kvHead) * p.cacheCapacity * DH;
    T const* cacheV = static_cast<T const*>(p.cacheV) + (static_cast<size_t>(b) * p.numKvHeads + kvHead) * p.cacheCapacity * DH;
    for (int32_t idx = threadIdx.x; idx < kKEY_TILE * DH / 2; idx += kTHREADS)
    {
        int32_t const j = idx / (DH / 2);
        int32_t const i = idx % (DH / 2);
        int32_t const key = keyBase + j;
        float k1 = 0.F;
        float k2 = 0.F;
        float v1 = 0.F;
        float v2 = 0.F;
        if (key < numCached)
        {
            size_t const off = static_cast<size_t>(key) * DH;
            k1 = toF(cacheK[off + i]);
            k2 = toF(cacheK[off + i + DH / 2]);
            v1 = toF(cacheV[off + i]);
            v2 = toF(cacheV[off + i + DH / 2]);
        }
        else if (key < numKeys)
        {
            int32_t const slot = key - numCached;
            size_t const off = ((static_cast<size_t>(b) * p.blockLen + slot) * p.numKvHeads + kvHead) * DH;
            T const* k = static_cast<T const*>(p.k) + off;
            T const* v = static_cast<T const*>(p.v) + off;
            k1 = toF(k[i]);
            k2 = toF(k[i + DH / 2]);
            rope<T>(k1, k2, p.rope, i, numCached + slot);
            v1 = toF(v[i]);
            v2 = toF(v[i + DH / 2]);
        }
        sK[j * L::kKV_STRIDE + i] = k1;
        sK[j * L::kKV_STRIDE + i + DH / 2] = k2;
        sV[j * L::kKV_STRIDE + i] = v1;
        sV[j * L::kKV_STRIDE + i + DH / 2] = v2;
    }
}

//! grid (splits, Hkv x row tiles, B), block kTHREADS. Online softmax over the key tiles of one context split.
//! Query row r of the group maps to block slot r / G and head kvHead * G + r % G.
template <typename T, int32_t DH>
__global__ void __launch_bounds__(kTHREADS) attentionKernel(
    DflashAttentionParams const p, int32_t numRowTiles, float* partialAcc, float* partialStats)
{
    using L = SmemLayout<DH>;
    extern __shared__ float smem[];
    float* sQ = smem + L::kQ;
    float* sAcc = smem + L::kACC;
    float* sK = smem + L::kK;
    float* sV = smem + L::kV;
    float* sS = smem + L::kS;
    float* sM = smem + L::kM;
    float* sL = smem + L::kL;
    float* sAlpha = smem + L::kALPHA;

    int32_t const split = blockIdx.x;
    int32_t const numSplits = gridDim.x;
    int32_t const kvHead = blockIdx.y / numRowTiles;
    int32_t const rowBase = (blockIdx.y % numRowTiles) * L::kROWS;
    int32_t const b = blockIdx.z;
    int32_t const group = p.numHeads / p.numKvHeads;
    int32_t const numRows = min(L::kROWS, group * p.blockLen - rowBase);
    int32_t const numCached = cachedRows(p, b);
    int32_t const numKeys = numCached + p.blockLen;
    int32_t const numTiles = (numKeys + kKEY_TILE - 1) / kKEY_TILE;
    int32_t const tilesPerSplit = (numTiles + numSplits - 1) / numSplits;
    int32_t const tileBegin = split * tilesPerSplit;
    int32_t const tileEnd = min(numTiles, tileBegin + tilesPerSplit);
    float const qScale = p.softmaxScale * kLOG2E; // scores in log2 units: exp2f below

    for (int32_t idx = threadIdx.x; idx < numRows * DH / 2; idx += kTHREADS)
    {
        int32_t const r = idx / (DH / 2);
        int32_t const i = idx % (DH / 2);
        int32_t const slot = (rowBase + r) / group;
        int32_t const head = kvHead * group + (rowBase + r) % group;
        T const* q = static_cast<T const*>(p.q) + ((static_cast<size_t>(b) * p.blockLen + slot) * p.numHeads + head) * DH;
        float x1 = toF(q[i]);
        float x2 = toF(q[i + DH / 2]);
        rope<T>(x1, x2, p.rope, i, numCached + slot);
        sQ[r * DH + i] = x1 * qScale;
        sQ[r * DH + i + DH / 2] = x2 * qScale;
    }
    for (int32_t idx = threadIdx.x; idx < numRows * DH; idx += kTHREADS)
    {
        sAcc[idx] = 0.F;
    }
    for (int32_t r = threadIdx.x; r < numRows; r += kTHREADS)
    {
        sM[r] = -INFINITY;
        sL[r] = 0.F;
    }

    int32_t const warp = threadIdx.x / 32;
    int32_t const lane = threadIdx.x % 32;
    for (int32_t tile = tileBegin; tile < tileEnd; ++tile)
    {
        int32_t const keyBase = tile * kKEY_TILE;
        __syncthreads(); // previous tile fully consumed (and sQ/sAcc initialised on the first pass)
        loadKeyValueTile<T, DH>(p, sK, sV, b, kvHead, keyBase, numCached, numKeys);
        __syncthreads();
        for (int32_t idx = threadIdx.x; idx < numRows * kKEY_TILE; idx += kTHREADS)
        {
            int32_t const r = idx / kKEY_TILE;
            int32_t const j = idx % kKEY_TILE;
            float const* qRow = sQ + r * DH;
            float const* kRow = sK + j * L::kKV_STRIDE;
            float dot = 0.F;
#pragma unroll 16
            for (int32_t d = 0; d < DH; ++d)
            {
                dot += qRow[d] * kRow[d];
            }
            sS[idx] = keyBase + j < numKeys ? dot : -INFINITY;
        }
        __syncthreads();
        // One warp per row, one lane per key: tile max, rescale factor and probabilities.
        for (int32_t r = warp; r < numRows; r += kWARPS)
        {
            float const score = sS[r * kKEY_TILE + lane];
            float tileMax = score;
#pragma unroll
            for (int32_t offset = 16; offset > 0; offset /= 2)
            {
                tileMax = fmaxf(tileMax, __shfl_xor_sync(0xFFFFFFFFU, tileMax, offset));
            }
            float const oldMax = sM[r];
            float const newMax = fmaxf(oldMax, tileMax); // finite: every tile holds at least one real key
            float const prob = exp2f(score - newMax);
            float sum = prob;
#pragma unroll
            for (int32_t offset = 16; offset > 0; offset /= 2)
            {
                sum += __shfl_xor_sync(0xFFFFFFFFU, sum, offset);
            }
            sS[r * kKEY_TILE + lane] = prob;
            __syncwarp();
            if (lane == 0)
            {
                float const alpha = exp2f(oldMax - newMax);
                sAlpha[r] = alpha;
                sL[r] = sL[r] * alpha + sum;
                sM[r] = newMax;
            }
        }
        __syncthreads();
        for (int32_t idx = threadIdx.x; idx < numRows * DH; idx += kTHREADS)
        {
            int32_t const r = idx / DH;
            int32_t const d = idx % DH;
            float const* probs = sS + r * kKEY_TILE;
            float acc = sAcc[idx] * sAlpha[r];
#pragma unroll 8
            for (int32_t j = 0; j < kKEY_TILE; ++j)
            {
                acc += probs[j] * sV[j * L::kKV_STRIDE + d];
            }
            sAcc[idx] = acc;
        }
    }
    __syncthreads();

    for (int32_t idx = threadIdx.x; idx < numRows * DH; idx += kTHREADS)
    {
        int32_t const r = idx / DH;
        int32_t const d = idx % DH;
        int32_t const slot = (rowBase + r) / group;
        int32_t const head = kvHead * group + (rowBase + r) % group;
        size_t const row = (static_cast<size_t>(b) * p.blockLen + slot) * p.numHeads + head;
        if (numSplits == 1)
        {
            static_cast<T*>(p.out)[row * DH + d] = fromF<T>(sAcc[idx] / sL[r]);
        }
        else
        {
            size_t const partialRow = static_cast<size_t>(split) * p.batch * p.blockLen * p.numHeads + row;
            partialAcc[partialRow * DH + d] = sAcc[idx];
            if (d == 0)
            {
                partialStats[partialRow * 2] = sM[r];
                partialStats[partialRow * 2 + 1] = sL[r];
            }
        }
    }
}

//! grid (B x S x Hq), block Dh: merge the per-split (max, sum, unnormalised output) of one query row.
template <typename T, int32_t DH>
__global__ void combineKernel(DflashAttentionParams const p, int32_t numSplits, float const* partialAcc,
    float const* partialStats)
{
    size_t const row = blockIdx.x;
    size_t const numRowsTotal = static_cast<size_t>(p.batch) * p.blockLen * p.numHeads;
    int32_t const d = threadIdx.x;
    float globalMax = -INFINITY;
    for (int32_t s = 0; s < numSplits; ++s)
    {
        globalMax = fmaxf(globalMax, partialStats[(s * numRowsTotal + row) * 2]);
    }
    float sum = 0.F;
    float acc = 0.F;
    for (int32_t s = 0; s < numSplits; ++s)
    {
        size_t const partialRow = s * numRowsTotal + row;
        float const weight = exp2f(partialStats[partialRow * 2] - globalMax); // empty split: exp2(-inf) = 0
        sum += weight * partialStats[partialRow * 2 + 1];
        acc += weight * partialAcc[partialRow * DH + d];
    }
    static_cast<T*>(p.out)[row * DH + d] = fromF<T>(acc / sum);
}

//! Splits of the context: enough CTAs to cover the SMs about twice, within the workspace and the longest context.
int32_t chooseNumSplits(DflashAttentionParams const& p, int32_t numRowTiles, size_t workspaceSize)
{
    if (workspaceSize < dflashAttentionWorkspaceSize(p.batch, p.blockLen, p.numHeads, p.headDim))
    {
        return 1;
    }
    int device = 0;
    int numSms = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&numSms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    {
        return 1;
    }
    int32_t const numCtas = p.batch * p.numKvHeads * numRowTiles;
    int32_t const maxTiles = (p.cacheCapacity + p.blockLen + kKEY_TILE - 1) / kKEY_TILE;
    int32_t const wanted = (2 * numSms + numCtas - 1) / numCtas;
    return std::max(1, std::min({wanted, maxTiles, kMAX_SPLITS}));
}

template <typename T, int32_t DH>
cudaError_t launchWithHeadDim(DflashAttentionParams const& p, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    using L = SmemLayout<DH>;
    if (p.ctxRows > 0)
    {
        appendContextKernel<T, DH><<<dim3(p.ctxRows, p.numKvHeads, p.batch), DH / 2, 0, stream>>>(p);
        cudaError_t const status = cudaGetLastError();
        if (status != cudaSuccess)
        {
            return status;
        }
    }
    int32_t const group = p.numHeads / p.numKvHeads;
    int32_t const numRowTiles = (group * p.blockLen + L::kROWS - 1) / L::kROWS;
    int32_t const numSplits = chooseNumSplits(p, numRowTiles, workspaceSize);
    float* partialAcc = static_cast<float*>(workspace);
    float* partialStats = partialAcc + static_cast<size_t>(numSplits) * p.batch * p.blockLen * p.numHeads * DH;

    cudaError_t status = cudaFuncSetAttribute(
        attentionKernel<T, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kBYTES));
    if (status != cudaSuccess)
    {
        return status;
    }
    dim3 const grid(numSplits, p.numKvHeads * numRowTiles, p.batch);
    attentionKernel<T, DH><<<grid, kTHREADS, L::kBYTES, stream>>>(p, numRowTiles, partialAcc, partialStats);
    status = cudaGetLastError();
    if (status != cudaSuccess || numSplits == 1)
    {
        return status;
    }
    combineKernel<T, DH><<<p.batch * p.blockLen * p.numHeads, DH, 0, stream>>>(p, numSplits, partialAcc, partialStats);
    return cudaGetLastError();
}

} // namespace

size_t dflashAttentionWorkspaceSize(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t headDim) noexcept
{
    size_t const rows = static_cast<size_t>(kMAX_SPLITS) * batch * blockLen * numHeads;
    return sizeof(float) * rows * (headDim + 2);
}

template <typename T>
cudaError_t launchDflashAttention(
    DflashAttentionParams const& params, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    if (params.batch < 1 || params.blockLen < 1 || params.ctxRows < 0 || params.cacheCapacity < 0
        || params.numKvHeads < 1 || params.numHeads % params.numKvHeads != 0)
    {
        return cudaErrorInvalidValue;
    }
    switch (params.headDim)
    {
    case 64: return launchWithHeadDim<T, 64>(params, workspace, workspaceSize, stream);
    case 128: return launchWithHeadDim<T, 128>(params, workspace, workspaceSize, stream);
    default: return cudaErrorInvalidValue;
    }
}

template cudaError_t launchDflashAttention<float>(DflashAttentionParams const&, void*, size_t, cudaStream_t);
template cudaError_t launchDflashAttention<__half>(DflashAttentionParams const&, void*, size_t, cudaStream_t);
template cudaError_t launchDflashAttention<__nv_bfloat16>(DflashAttentionParams const&, void*, size_t, cudaStream_t);

cudaError_t launchDflashAttention(
    DflashAttentionParams const& params, DataType type, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    switch (type)
    {
    case DataType::kFLOAT: return launchDflashAttention<float>(params, workspace, workspaceSize, stream);
    case DataType::kHALF: return launchDflashAttention<__half>(params, workspace, workspaceSize, stream);
    case DataType::kBF16: return launchDflashAttention<__nv_bfloat16>(params, workspace, workspaceSize, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace dflash
