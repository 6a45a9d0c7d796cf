/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Launch plan of the DFlash draft-attention kernels, as host functions with no CUDA dependency: the CUDA launcher,
 * the TensorRT plugin, the torch extension and the unit tests of the CPU library all use these, so the shared-memory
 * budget, the split of the context and the workspace layout are computed (and tested) in one place.
 *
 * Split-K: the keys of a sequence ([cache rows ; block]) are cut into splits of exactly kKEYS_PER_SPLIT keys (the
 * last one shorter). The number of splits of a sequence depends only on its own length, never on the batch, the
 * other sequences or the GPU, so a sequence's output is bit-identical whatever batch it is drafted in.
 */
#ifndef DFLASH_ATTENTION_PLAN_H
#define DFLASH_ATTENTION_PLAN_H

#include "dflashAttentionConfig.h"

#include <cstddef>
#include <cstdint>
#include <string>

//! The constexpr plan functions are also called from the kernels.
#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

namespace dflash
{

//! Keys of one context split (a multiple of both key tiles below).
constexpr int32_t kKEYS_PER_SPLIT{512};
//! Tensor-core kernel (fp16/bf16): keys per shared-memory tile, query rows per CTA (4 warps x 16), pipeline depth.
constexpr int32_t kMMA_KEY_TILE{64};
constexpr int32_t kMMA_ROWS{64};
constexpr int32_t kMMA_THREADS{128};
constexpr int32_t kMMA_STAGES{3};
//! CUDA-core kernel (fp32): keys per tile (one per lane) and query-row elements per CTA.
constexpr int32_t kSCALAR_KEY_TILE{32};
constexpr int32_t kSCALAR_ROW_ELEMENTS{4096};
constexpr int32_t kSCALAR_THREADS{128};
//! Largest dynamic shared memory per CTA on every supported architecture (sm_120/121 allow 99 KB; sm_90/100 more).
constexpr size_t kMAX_SHARED_BYTES{99 * 1024};
//! Alignment of every workspace region (and of the tensors the tensor-core kernel reads with 16-byte copies).
constexpr size_t kWORKSPACE_ALIGNMENT{256};

//! Element type code shared with DataType (dflashAttentionParams.h): 0 fp32, 1 fp16, 2 bf16.
DFLASH_HOST_DEVICE constexpr bool usesTensorCores(int32_t dataType)
{
    return dataType != 0;
}

//! Query rows (block slots x heads of a GQA group) one CTA holds.
DFLASH_HOST_DEVICE constexpr int32_t rowsPerCta(int32_t dataType, int32_t headDim)
{
    return usesTensorCores(dataType) ? kMMA_ROWS : kSCALAR_ROW_ELEMENTS / headDim;
}

//! Padded fp32 row stride of the scalar kernel's key/value tiles (+1 keeps per-key column reads conflict-free).
DFLASH_HOST_DEVICE constexpr int32_t scalarKvStride(int32_t headDim)
{
    return headDim + 1;
}

//! Dynamic shared memory of the attention kernel: the tensor-core kernel holds kMMA_STAGES tiles of K and V in the
//! I/O type; the scalar kernel holds fp32 q, accumulator, one K/V tile, scores and per-row statistics.
DFLASH_HOST_DEVICE constexpr size_t sharedMemoryBytes(int32_t dataType, int32_t headDim)
{
    if (usesTensorCores(dataType))
    {
        return static_cast<size_t>(kMMA_STAGES) * 2 * kMMA_KEY_TILE * headDim * 2;
    }
    size_t const rows = static_cast<size_t>(kSCALAR_ROW_ELEMENTS / headDim);
    return sizeof(float)
        * (2 * rows * headDim + 2 * static_cast<size_t>(kSCALAR_KEY_TILE) * scalarKvStride(headDim)
            + rows * kSCALAR_KEY_TILE + 3 * rows);
}

//! Splits of a sequence attending to numKeys keys (cache rows + block): ceil(numKeys / kKEYS_PER_SPLIT), at least 1.
DFLASH_HOST_DEVICE constexpr int32_t numSplitsForKeys(int32_t numKeys)
{
    return numKeys <= kKEYS_PER_SPLIT ? 1 : (numKeys + kKEYS_PER_SPLIT - 1) / kKEYS_PER_SPLIT;
}

//! Where each part of the workspace lives (byte offsets) and how many splits it holds partials for.
struct WorkspaceLayout
{
    int32_t maxSplits;   //!< splits of the longest possible sequence (cache capacity + block)
    size_t ropedQ;       //!< [B, Hkv, G*S, Dh] RoPE'd queries in the I/O type, rows ordered (slot, head of group)
    size_t ropedK;       //!< [B, Hkv, S, Dh] RoPE'd block keys in the I/O type
    size_t partialAcc;   //!< [maxSplits, B*S*Hq, Dh] fp32 unnormalised split outputs (only when maxSplits > 1)
    size_t partialStats; //!< [maxSplits, B*S*Hq, 2] fp32 (max, sum) in log2 units (only when maxSplits > 1)
    size_t totalBytes;
};

//! The exact workspace of one call; valid for any call with smaller batch, block or capacity too.
WorkspaceLayout workspaceLayout(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
    int32_t headDim, int32_t cacheCapacity, int32_t dataType) noexcept;

//! Dims of the 9 inputs, in the order of the op (q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens).
//! A negative dim is unknown (a TensorRT build-time symbol) and matches anything.
struct InputDims
{
    int32_t nbDims[9];
    int64_t d[9][4];
};

//! Empty when the inputs are consistent with each other and with the fields (q [B,S,Hq,Dh], k/v [B,S,Hkv,Dh],
//! ctx_k/ctx_v [B,C,Hkv,Dh], cache_k/cache_v [B,Hkv,Cmax,Dh], lens [B]); else a one-line message naming the input.
std::string checkInputDims(DflashAttentionFields const& fields, InputDims const& dims);

} // namespace dflash

#endif // DFLASH_ATTENTION_PLAN_H
