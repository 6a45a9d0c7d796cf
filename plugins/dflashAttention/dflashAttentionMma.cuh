/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The tensor-core attention kernel (fp16/bf16): PTX wrappers (cp.async, ldmatrix, mma.sync) and mmaAttentionKernel.
 * Included by dflashAttentionKernel.cu only (internal linkage).
 */
#ifndef DFLASH_ATTENTION_MMA_CUH
#define DFLASH_ATTENTION_MMA_CUH

#include "dflashAttentionCommon.cuh"

namespace dflash
{
namespace
{

// ---------------------------------------------------------------------------------------------------------------------
// Tensor-core attention (fp16/bf16)

__device__ __forceinline__ uint32_t sharedAddress(void const* ptr)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

//! 16-byte asynchronous copy global -> shared; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cpAsync16(void* dst, void const* src, bool valid)
{
    int32_t const bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(dst)), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cpAsyncCommit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int32_t N>
__device__ __forceinline__ void cpAsyncWait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], void const* ptr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(ptr)));
}

__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], void const* ptr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(ptr)));
}

//! d += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

//! Element offset of (row, 16-byte chunk) in a [kMMA_KEY_TILE, DH] tile: chunks XOR-swizzled by row % 8 so the eight
//! row addresses of an ldmatrix fall into distinct banks.
template <int32_t DH>
__device__ __forceinline__ int32_t tileOffset(int32_t row, int32_t chunk)
{
    return row * DH + ((chunk ^ (row & 7)) << 3);
}

//! grid (maxSplits, Hkv x row tiles, B), block kMMA_THREADS (4 warps x 16 query rows).
//! tests/plugin/test_plugin_mma_emulation.py transcribes this kernel's index formulas over a NumPy emulation of
//! ldmatrix and mma.m16n8k16 (PTX ISA fragment layouts): keep the two in step.
//! S = Q K^T and O += P V on tensor cores (fp32 accumulation), online softmax in fp32 registers, K/V tiles of
//! kMMA_KEY_TILE keys streamed through a kMMA_STAGES-deep cp.async pipeline. P is rounded to T for the P V product
//! and the row sums are taken over the rounded P, so the normalisation matches the weights actually applied.
template <typename T, int32_t DH>
__global__ void __launch_bounds__(kMMA_THREADS) mmaAttentionKernel(
    DflashAttentionParams const p, Workspace const ws, int32_t numRowTiles)
{
    constexpr int32_t kCHUNKS = DH / 8;             // 16-byte chunks per row
    constexpr int32_t kKSTEPS = DH / 16;            // k steps of Q K^T
    constexpr int32_t kKEY_NTILES = kMMA_KEY_TILE / 8;
    constexpr int32_t kDH_NTILES = DH / 8;
    constexpr int32_t kTILE_ELEMENTS = kMMA_KEY_TILE * DH;
    extern __shared__ __align__(128) unsigned char smemRaw[];
    T* sK = reinterpret_cast<T*>(smemRaw);
    T* sV = sK + kMMA_STAGES * kTILE_ELEMENTS;

    int32_t const split = blockIdx.x;
    int32_t const kvHead = blockIdx.y / numRowTiles;
    int32_t const rowBase = (blockIdx.y % numRowTiles) * kMMA_ROWS;
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
    int32_t const numTiles = (keyEnd - keyBegin + kMMA_KEY_TILE - 1) / kMMA_KEY_TILE;
    int32_t const tid = threadIdx.x;
    int32_t const warp = tid / 32;
    int32_t const lane = tid % 32;
    int32_t const quadRow = lane / 4; // groupID of the mma fragment layouts
    int32_t const quadCol = lane % 4; // threadID_in_group

    size_t const headIndex = static_cast<size_t>(b) * p.numKvHeads + kvHead;
    T const* cacheK = static_cast<T const*>(p.cacheK) + headIndex * p.cacheCapacity * DH;
    T const* cacheV = static_cast<T const*>(p.cacheV) + headIndex * p.cacheCapacity * DH;
    T const* blockK = static_cast<T const*>(ws.ropedK) + headIndex * p.blockLen * DH;
    T const* blockV = static_cast<T const*>(p.v) + static_cast<size_t>(b) * p.blockLen * p.numKvHeads * DH + kvHead * DH;
    size_t const blockVStride = static_cast<size_t>(p.numKvHeads) * DH;

    auto loadTile = [&](int32_t tile, int32_t stage) {
        int32_t const key0 = keyBegin + tile * kMMA_KEY_TILE;
        T* dstK = sK + stage * kTILE_ELEMENTS;
        T* dstV = sV + stage * kTILE_ELEMENTS;
        for (int32_t c = tid; c < kMMA_KEY_TILE * kCHUNKS; c += kMMA_THREADS)
        {
            int32_t const row = c / kCHUNKS;
            int32_t const chunk = c % kCHUNKS;
            int32_t const key = key0 + row;
            T const* srcK = cacheK; // any valid address when zero-filling
            T const* srcV = cacheV;
            if (key < min(numCached, keyEnd))
            {
                srcK = cacheK + static_cast<size_t>(key) * DH + chunk * 8;
                srcV = cacheV + static_cast<size_t>(key) * DH + chunk * 8;
            }
            else if (key < keyEnd)
            {
                int32_t const slot = key - numCached;
                srcK = blockK + static_cast<size_t>(slot) * DH + chunk * 8;
                srcV = blockV + slot * blockVStride + chunk * 8;
            }
            int32_t const offset = tileOffset<DH>(row, chunk);
            cpAsync16(dstK + offset, srcK, key < keyEnd);
            cpAsync16(dstV + offset, srcV, key < keyEnd);
        }
    };

#pragma unroll
    for (int32_t stage = 0; stage < kMMA_STAGES - 1; ++stage)
    {
        if (stage < numTiles)
        {
            loadTile(stage, stage);
        }
        cpAsyncCommit();
    }

    // Q fragments of this warp's 16 rows stay in registers for the whole split (A operand layout of m16n8k16).
    int32_t const row0 = rowBase + warp * 16 + quadRow;
    int32_t const row1 = row0 + 8;
    bool const warpActive = rowBase + warp * 16 < totalRows;
    uint32_t qFrag[kKSTEPS][4];
    {
        uint32_t const* q32 = static_cast<uint32_t const*>(ws.ropedQ);
        size_t const qBase = headIndex * totalRows * DH / 2;
#pragma unroll
        for (int32_t kk = 0; kk < kKSTEPS; ++kk)
        {
            int32_t const col = kk * 16 + quadCol * 2;
            qFrag[kk][0] = row0 < totalRows ? q32[qBase + (static_cast<size_t>(row0) * DH + col) / 2] : 0U;
            qFrag[kk][1] = row1 < totalRows ? q32[qBase + (static_cast<size_t>(row1) * DH + col) / 2] : 0U;
            qFrag[kk][2] = row0 < totalRows ? q32[qBase + (static_cast<size_t>(row0) * DH + col + 8) / 2] : 0U;
            qFrag[kk][3] = row1 < totalRows ? q32[qBase + (static_cast<size_t>(row1) * DH + col + 8) / 2] : 0U;
        }
    }

    float const qScale = p.softmaxScale * kLOG2E; // scores in log2 units: exp2f below
    float acc[kDH_NTILES][4];
#pragma unroll
    for (int32_t d = 0; d < kDH_NTILES; ++d)
    {
        acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.F;
    }
    float rowMax[2] = {-INFINITY, -INFINITY};
    float rowSum[2] = {0.F, 0.F}; // this thread's share; the quad's four shares are added at the end

    for (int32_t tile = 0; tile < numTiles; ++tile)
    {
        cpAsyncWait<kMMA_STAGES - 2>(); // this thread's copies of `tile` have landed
        __syncthreads();                // everyone's have, and everyone is done with tile - 1's stage
        if (tile + kMMA_STAGES - 1 < numTiles)
        {
            loadTile(tile + kMMA_STAGES - 1, (tile + kMMA_STAGES - 1) % kMMA_STAGES);
        }
        cpAsyncCommit();
        if (!warpActive)
        {
            continue;
        }
        T const* tileK = sK + (tile % kMMA_STAGES) * kTILE_ELEMENTS;
        T const* tileV = sV + (tile % kMMA_STAGES) * kTILE_ELEMENTS;

        float score[kKEY_NTILES][4];
#pragma unroll
        for (int32_t j = 0; j < kKEY_NTILES; ++j)
        {
            score[j][0] = score[j][1] = score[j][2] = score[j][3] = 0.F;
        }
        // ldmatrix.x4: lanes 8m..8m+7 address rows of matrix m = (key tile j + m/2, chunk 2kk + m%2).
        int32_t const matrix = lane / 8;
        int32_t const matrixRow = lane % 8;
#pragma unroll
        for (int32_t kk = 0; kk < kKSTEPS; ++kk)
        {
#pragma unroll
            for (int32_t j = 0; j < kKEY_NTILES; j += 2)
            {
                uint32_t bFrag[4];
                int32_t const key = (j + matrix / 2) * 8 + matrixRow;
                ldmatrixX4(bFrag, tileK + tileOffset<DH>(key, 2 * kk + matrix % 2));
                mma16816<T>(score[j], qFrag[kk], bFrag[0], bFrag[1]);
                mma16816<T>(score[j + 1], qFrag[kk], bFrag[2], bFrag[3]);
            }
        }

        // Online softmax: rows row0 (elements 0, 1) and row1 (elements 2, 3) of each key n-tile.
        int32_t const tileKey0 = keyBegin + tile * kMMA_KEY_TILE;
        float tileMax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int32_t j = 0; j < kKEY_NTILES; ++j)
        {
#pragma unroll
            for (int32_t e = 0; e < 4; ++e)
            {
                int32_t const key = tileKey0 + j * 8 + quadCol * 2 + (e & 1);
                score[j][e] = key < keyEnd ? score[j][e] * qScale : -INFINITY;
                tileMax[e / 2] = fmaxf(tileMax[e / 2], score[j][e]);
            }
        }
        float alpha[2];
#pragma unroll
        for (int32_t r = 0; r < 2; ++r)
        {
            tileMax[r] = fmaxf(tileMax[r], __shfl_xor_sync(0xFFFFFFFFU, tileMax[r], 1));
            tileMax[r] = fmaxf(tileMax[r], __shfl_xor_sync(0xFFFFFFFFU, tileMax[r], 2));
            float const newMax = fmaxf(rowMax[r], tileMax[r]); // finite: every tile holds a real key
            alpha[r] = exp2f(rowMax[r] - newMax);
            rowMax[r] = newMax;
            rowSum[r] *= alpha[r];
        }
#pragma unroll
        for (int32_t d = 0; d < kDH_NTILES; ++d)
        {
            acc[d][0] *= alpha[0];
            acc[d][1] *= alpha[0];
            acc[d][2] *= alpha[1];
            acc[d][3] *= alpha[1];
        }

        // P V: the score accumulators of key n-tiles (2s, 2s+1) form the A fragment of key step s.
#pragma unroll
        for (int32_t step = 0; step < kMMA_KEY_TILE / 16; ++step)
        {
            uint32_t pFrag[4];
#pragma unroll
            for (int32_t half = 0; half < 2; ++half)
            {
                float const* s = score[2 * step + half];
                float lo;
                float hi;
                pFrag[2 * half] = packRounded<T>(exp2f(s[0] - rowMax[0]), exp2f(s[1] - rowMax[0]), lo, hi);
                rowSum[0] += lo + hi;
                pFrag[2 * half + 1] = packRounded<T>(exp2f(s[2] - rowMax[1]), exp2f(s[3] - rowMax[1]), lo, hi);
                rowSum[1] += lo + hi;
            }
            // ldmatrix.x4.trans: matrix m = (keys 16 step + 8 (m%2) .., dh chunk d + m/2).
            int32_t const key = step * 16 + (matrix % 2) * 8 + matrixRow;
#pragma unroll
            for (int32_t d = 0; d < kDH_NTILES; d += 2)
            {
                uint32_t bFrag[4];
                ldmatrixX4Trans(bFrag, tileV + tileOffset<DH>(key, d + matrix / 2));
                mma16816<T>(acc[d], pFrag, bFrag[0], bFrag[1]);
                mma16816<T>(acc[d + 1], pFrag, bFrag[2], bFrag[3]);
            }
        }
    }
    cpAsyncWait<0>();
    if (!warpActive)
    {
        return;
    }

#pragma unroll
    for (int32_t r = 0; r < 2; ++r)
    {
        rowSum[r] += __shfl_xor_sync(0xFFFFFFFFU, rowSum[r], 1);
        rowSum[r] += __shfl_xor_sync(0xFFFFFFFFU, rowSum[r], 2);
    }
    bool const direct = keyBegin == 0 && keyEnd == numCached + p.blockLen; // the sequence has a single split
    size_t const numQueryRows = static_cast<size_t>(p.batch) * p.blockLen * p.numHeads;
#pragma unroll
    for (int32_t r = 0; r < 2; ++r)
    {
        int32_t const row = r == 0 ? row0 : row1;
        if (row >= totalRows)
        {
            continue;
        }
        size_t const outRow = outputRow(p, b, kvHead, row);
        if (direct)
        {
            float const inv = 1.F / rowSum[r];
            uint32_t* out32 = reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + outRow * DH);
#pragma unroll
            for (int32_t d = 0; d < kDH_NTILES; ++d)
            {
                float lo;
                float hi;
                out32[(d * 8 + quadCol * 2) / 2]
                    = packRounded<T>(acc[d][2 * r] * inv, acc[d][2 * r + 1] * inv, lo, hi);
            }
        }
        else
        {
            size_t const partialRow = static_cast<size_t>(split) * numQueryRows + outRow;
            float2* acc2 = reinterpret_cast<float2*>(ws.partialAcc + partialRow * DH);
#pragma unroll
            for (int32_t d = 0; d < kDH_NTILES; ++d)
            {
                acc2[(d * 8 + quadCol * 2) / 2] = make_float2(acc[d][2 * r], acc[d][2 * r + 1]);
            }
            if (quadCol == 0)
            {
                ws.partialStats[partialRow * 2] = rowMax[r];
                ws.partialStats[partialRow * 2 + 1] = rowSum[r];
            }
        }
    }
}

} // namespace
} // namespace dflash

#endif // DFLASH_ATTENTION_MMA_CUH
