/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA kernels of the DFlash draft attention: one launcher per operation, explicitly instantiated per dtype.
 *
 *   launchDflashAttention  = appendContextKernel (RoPE + cache write of the new context rows)
 *                          + attentionKernel     (one CTA per sequence x KV head x context split; every query head
 *                                                 of the GQA group shares one read of each key/value tile)
 *                          + combineKernel       (only when the context is split: merges the partial softmaxes)
 */
#ifndef DFLASH_ATTENTION_KERNEL_H
#define DFLASH_ATTENTION_KERNEL_H

#include "dflashAttentionParams.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace dflash
{

//! Most context splits one call may use (bounds the workspace).
constexpr int32_t kMAX_SPLITS{16};
//! Keys per shared-memory tile; equals the warp size (one lane per key in the softmax update).
constexpr int32_t kKEY_TILE{32};
//! Query rows (block slots x heads of a group) one CTA holds: kMAX_ROW_ELEMENTS / headDim.
constexpr int32_t kMAX_ROW_ELEMENTS{8192};

//! Workspace bytes one call needs for the split-context partial results (0 is allowed: then no split).
size_t dflashAttentionWorkspaceSize(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t headDim) noexcept;

//! Enqueue the op on `stream`. T is float, __half or __nv_bfloat16. All pointers of params are device pointers.
//! cacheLens/ctxLens are read on the device only; lengths that do not fit the cache are clamped, never written out of
//! bounds. Returns the first CUDA error (launch configuration included).
template <typename T>
cudaError_t launchDflashAttention(
    DflashAttentionParams const& params, void* workspace, size_t workspaceSize, cudaStream_t stream);

//! launchDflashAttention dispatched on a runtime element type.
cudaError_t launchDflashAttention(DflashAttentionParams const& params, DataType type, void* workspace,
    size_t workspaceSize, cudaStream_t stream);

} // namespace dflash

#endif // DFLASH_ATTENTION_KERNEL_H
