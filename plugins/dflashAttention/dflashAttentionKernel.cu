/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "dflashAttentionKernel.h"

#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

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

//! Raise a kernel's dynamic shared-memory limit once per device (cudaFuncSetAttribute is not a per-launch call).
template <typename Kernel>
cudaError_t allowSharedMemory(Kernel kernel, size_t bytes)
{
    static std::mutex mutex;
    static uint64_t configuredDevices = 0;
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess || bytes <= 48 * 1024 || device >= 64)
    {
        return device >= 64 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                   static_cast<int>(bytes))
                            : status;
    }
    std::lock_guard<std::mutex> lock(mutex);
    if ((configuredDevices >> device & 1U) == 0)
    {
        status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        if (status == cudaSuccess)
        {
            configuredDevices |= uint64_t{1} << device;
        }
    }
    return status;
}

template <typename T>
constexpr int32_t dataTypeCode()
{
    return sizeof(T) == 4 ? 0 : (std::is_same<T, __half>::value ? 1 : 2);
}

bool aligned16(void const* ptr)
{
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T, int32_t DH>
cudaError_t launchWithHeadDim(DflashAttentionParams const& p, void* workspace, size_t workspaceSize, cudaStream_t stream)
{
    constexpr int32_t kTYPE = dataTypeCode<T>();
    WorkspaceLayout const layout
        = workspaceLayout(p.batch, p.blockLen, p.numHeads, p.numKvHeads, DH, p.cacheCapacity, kTYPE);
    if (workspace == nullptr || workspaceSize < layout.totalBytes)
    {
        return cudaErrorInvalidValue;
    }
    if (kTYPE != 0
        && !(aligned16(p.v) && aligned16(p.cacheK) && aligned16(p.cacheV) && aligned16(workspace)))
    {
        return cudaErrorMisalignedAddress;
    }
    char* base = static_cast<char*>(workspace);
    Workspace const ws{base + layout.ropedQ, base + layout.ropedK, reinterpret_cast<float*>(base + layout.partialAcc),
        reinterpret_cast<float*>(base + layout.partialStats), layout.maxSplits};

    prepareKernel<T, DH><<<dim3(p.ctxRows + p.blockLen, p.numKvHeads, p.batch), DH / 2, 0, stream>>>(p, ws);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess)
    {
        return status;
    }
    int32_t const group = p.numHeads / p.numKvHeads;
    int32_t const rows = rowsPerCta(kTYPE, DH);
    int32_t const numRowTiles = (group * p.blockLen + rows - 1) / rows;
    dim3 const grid(layout.maxSplits, p.numKvHeads * numRowTiles, p.batch);
    size_t const smemBytes = sharedMemoryBytes(kTYPE, DH);
    if constexpr (kTYPE == 0)
    {
        status = allowSharedMemory(scalarAttentionKernel<DH>, smemBytes);
        if (status == cudaSuccess)
        {
            scalarAttentionKernel<DH><<<grid, kSCALAR_THREADS, smemBytes, stream>>>(p, ws, numRowTiles);
        }
    }
    else
    {
        status = allowSharedMemory(mmaAttentionKernel<T, DH>, smemBytes);
        if (status == cudaSuccess)
        {
            mmaAttentionKernel<T, DH><<<grid, kMMA_THREADS, smemBytes, stream>>>(p, ws, numRowTiles);
        }
    }
    if (status != cudaSuccess)
    {
        return status;
    }
    status = cudaGetLastError();
    if (status != cudaSuccess || layout.maxSplits == 1)
    {
        return status;
    }
    combineKernel<T, DH><<<p.batch * p.blockLen * p.numHeads, DH, 0, stream>>>(p, ws);
    return cudaGetLastError();
}

} // namespace

size_t dflashAttentionWorkspaceSize(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
    int32_t headDim, int32_t cacheCapacity, DataType type) noexcept
{
    return workspaceLayout(batch, blockLen, numHeads, numKvHeads, headDim, cacheCapacity, static_cast<int32_t>(type))
        .totalBytes;
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
