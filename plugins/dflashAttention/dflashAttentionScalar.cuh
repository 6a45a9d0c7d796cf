/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The CUDA-core attention kernel (fp32): scalarAttentionKernel.
 * Included by dflashAttentionKernel.cu only (internal linkage).
 */
#ifndef DFLASH_ATTENTION_SCALAR_CUH
#define DFLASH_ATTENTION_SCALAR_CUH

#include "dflashAttentionCommon.cuh"

namespace dflash
{
namespace
{

// ---------------------------------------------------------------------------------------------------------------------
// CUDA-core attention (fp32)

//! Shared-memory layout of scalarAttentionKernel (floats); its size is sharedMemoryBytes(0, DH).
template <int32_t DH>
struct ScalarLayout
{
    static constexpr int32_t kROWS = kSCALAR_ROW_ELEMENTS / DH;
    static constexpr int32_t kKV_STRIDE = scalarKvStride(DH);
    static constexpr int32_t kQ = 0;
    static constexpr int32_t kACC = kQ + kROWS * DH;
    static constexpr int32_t kK = kACC + kROWS * DH;
    static constexpr int32_t kV = kK + kSCALAR_KEY_TILE * kKV_STRIDE;
    static constexpr int32_t kS = kV + kSCALAR_KEY_TILE * kKV_STRIDE;
    static constexpr int32_t kM = kS + kROWS * kSCALAR_KEY_TILE;
    static constexpr int32_t kL = kM + kROWS;
    static constexpr int32_t kALPHA = kL + kROWS;
    static constexpr size_t kBYTES = sizeof(float) * (kALPHA + kROWS);
    static_assert(kBYTES == sharedMemoryBytes(0, DH), "scalar layout and plan disagree");
};

//! grid (maxSplits, Hkv x row tiles, B), block kSCALAR_THREADS. Online softmax over 32-key tiles of one split.
template <int32_t DH>
__global__ void __launch_bounds__(kSCALAR_THREADS) scalarAttentionKernel(
    DflashAttentionParams const p, Workspace const ws, int32_t numRowTiles)
{
    using L = ScalarLayout<DH>;
    constexpr int32_t kWARPS = kSCALAR_THREADS / 32;
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
    int32_t const kvHead = blockIdx.y / numRowTiles;
    int32_t const rowBase = (blockIdx.y % numRowTiles) * L::kROWS;
    int32_t const b = blockIdx.z;
    int32_t numCached;
    int32_t keyBegin;
    int32_t keyEnd;
    if (!splitRange(p, b, split, numCached, keyBegin, keyEnd))
    {
        return;
    }
    int32_t const group = p.numHeads / p.numKvHeads;
    int32_t const totalRows = group * p.blockLen;
    int32_t const numRows = min(L::kROWS, totalRows - rowBase);
    size_t const headIndex = static_cast<size_t>(b) * p.numKvHeads + kvHead;
    float const* cacheK = static_cast<float const*>(p.cacheK) + headIndex * p.cacheCapacity * DH;
    float const* cacheV = static_cast<float const*>(p.cacheV) + headIndex * p.cacheCapacity * DH;
    float const* blockK = static_cast<float const*>(ws.ropedK) + headIndex * p.blockLen * DH;
    float const* blockV = static_cast<float const*>(p.v) + static_cast<size_t>(b) * p.blockLen * p.numKvHeads * DH
        + kvHead * DH;
    float const* ropedQ = static_cast<float const*>(ws.ropedQ) + (headIndex * totalRows + rowBase) * DH;
    float const qScale = p.softmaxScale * kLOG2E;

    for (int32_t idx = threadIdx.x; idx < numRows * DH; idx += kSCALAR_THREADS)
    {
        sQ[idx] = ropedQ[idx] * qScale;
        sAcc[idx] = 0.F;
    }
    for (int32_t r = threadIdx.x; r < numRows; r += kSCALAR_THREADS)
    {
        sM[r] = -INFINITY;
        sL[r] = 0.F;
    }
    int32_t const warp = threadIdx.x / 32;
    int32_t const lane = threadIdx.x % 32;
    for (int32_t keyBase = keyBegin; keyBase < keyEnd; keyBase += kSCALAR_KEY_TILE)
    {
        __syncthreads(); // previous tile consumed (and sQ/sAcc initialised on the first pass)
        for (int32_t idx = threadIdx.x; idx < kSCALAR_KEY_TILE * DH; idx += kSCALAR_THREADS)
        {
            int32_t const j = idx / DH;
            int32_t const d = idx % DH;
            int32_t const key = keyBase + j;
            float kx = 0.F;
            float vx = 0.F;
            if (key < min(numCached, keyEnd))
            {
                kx = cacheK[static_cast<size_t>(key) * DH + d];
                vx = cacheV[static_cast<size_t>(key) * DH + d];
            }
            else if (key < keyEnd)
            {
                int32_t const slot = key - numCached;
                kx = blockK[static_cast<size_t>(slot) * DH + d];
                vx = blockV[static_cast<size_t>(slot) * p.numKvHeads * DH + d];
            }
            sK[j * L::kKV_STRIDE + d] = kx;
            sV[j * L::kKV_STRIDE + d] = vx;
        }
        __syncthreads();
        for (int32_t idx = threadIdx.x; idx < numRows * kSCALAR_KEY_TILE; idx += kSCALAR_THREADS)
        {
            int32_t const r = idx / kSCALAR_KEY_TILE;
            int32_t const j = idx % kSCALAR_KEY_TILE;
            float const* qRow = sQ + r * DH;
            float const* kRow = sK + j * L::kKV_STRIDE;
            float dot = 0.F;
#pragma unroll 16
            for (int32_t d = 0; d < DH; ++d)
            {
                dot += qRow[d] * kRow[d];
            }
            sS[idx] = keyBase + j < keyEnd ? dot : -INFINITY;
        }
        __syncthreads();
        for (int32_t r = warp; r < numRows; r += kWARPS)
        {
            float const score = sS[r * kSCALAR_KEY_TILE + lane];
            float tileMax = score;
#pragma unroll
            for (int32_t offset = 16; offset > 0; offset /= 2)
            {
                tileMax = fmaxf(tileMax, __shfl_xor_sync(0xFFFFFFFFU, tileMax, offset));
            }
            float const oldMax = sM[r];
            float const newMax = fmaxf(oldMax, tileMax);
            float const prob = exp2f(score - newMax);
            float sum = prob;
#pragma unroll
            for (int32_t offset = 16; offset > 0; offset /= 2)
            {
                sum += __shfl_xor_sync(0xFFFFFFFFU, sum, offset);
            }
            sS[r * kSCALAR_KEY_TILE + lane] = prob;
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
        for (int32_t idx = threadIdx.x; idx < numRows * DH; idx += kSCALAR_THREADS)
        {
            int32_t const r = idx / DH;
            int32_t const d = idx % DH;
            float const* probs = sS + r * kSCALAR_KEY_TILE;
            float acc = sAcc[idx] * sAlpha[r];
#pragma unroll 8
            for (int32_t j = 0; j < kSCALAR_KEY_TILE; ++j)
            {
                acc += probs[j] * sV[j * L::kKV_STRIDE + d];
            }
            sAcc[idx] = acc;
        }
    }
    __syncthreads();

    bool const direct = keyBegin == 0 && keyEnd == numCached + p.blockLen;
    size_t const numQueryRows = static_cast<size_t>(p.batch) * p.blockLen * p.numHeads;
    for (int32_t idx = threadIdx.x; idx < numRows * DH; idx += kSCALAR_THREADS)
    {
        int32_t const r = idx / DH;
        int32_t const d = idx % DH;
        size_t const outRow = outputRow(p, b, kvHead, rowBase + r);
        if (direct)
        {
            static_cast<float*>(p.out)[outRow * DH + d] = sAcc[idx] / sL[r];
        }
        else
        {
            size_t const partialRow = static_cast<size_t>(split) * numQueryRows + outRow;
            ws.partialAcc[partialRow * DH + d] = sAcc[idx];
            if (d == 0)
            {
                ws.partialStats[partialRow * 2] = sM[r];
                ws.partialStats[partialRow * 2 + 1] = sL[r];
            }
        }
    }
}

} // namespace
} // namespace dflash

#endif // DFLASH_ATTENTION_SCALAR_CUH
