/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA kernels of the DFlash draft attention: one launcher, explicitly instantiated per dtype.
 *
 *   launchDflashAttention = prepareKernel   (RoPE + cache write of the new context rows; RoPE'd block queries and
 *                                            keys into the workspace)
 *                         + attentionKernel (one CTA per sequence x KV head x row tile x context split of
 *                                            kKEYS_PER_SPLIT keys; every query head of the GQA group and every
 *                                            block slot share each key/value tile; fp16/bf16 on tensor cores with
 *                                            mma.sync m16n8k16 and a cp.async pipeline, fp32 on CUDA cores)
 *                         + combineKernel   (merges the partial softmaxes of sequences with more than one split)
 * The launch plan (splits, shared memory, workspace) is in dflashAttentionPlan.h.
 */
#ifndef DFLASH_ATTENTION_KERNEL_H
#define DFLASH_ATTENTION_KERNEL_H

#include "dflashAttentionParams.h"
#include "dflashAttentionPlan.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace dflash
{

//! Workspace bytes of a call (workspaceLayout(...).totalBytes); a workspace of this size for the largest batch,
//! block and capacity serves every smaller call.
size_t dflashAttentionWorkspaceSize(int32_t batch, int32_t blockLen, int32_t numHeads, int32_t numKvHeads,
    int32_t headDim, int32_t cacheCapacity, DataType type) noexcept;

//! Enqueue the op on `stream`. T is float, __half or __nv_bfloat16. All pointers of params are device pointers;
//! for fp16/bf16 the value tensors and the workspace must be 16-byte aligned. cacheLens/ctxLens are read on the device
//! only; lengths that do not fit the cache are clamped, never written out of bounds. Returns cudaErrorInvalidValue
//! for bad shapes or a workspace smaller than dflashAttentionWorkspaceSize, cudaErrorMisalignedAddress for
//! misaligned tensors, else the first CUDA error (launch configuration included). No host synchronisation and no
//! allocation: safe to capture in a CUDA graph (the first call per device sets the kernels' shared-memory limit, so
//! make it outside a capture).
template <typename T>
cudaError_t launchDflashAttention(
    DflashAttentionParams const& params, void* workspace, size_t workspaceSize, cudaStream_t stream);

//! launchDflashAttention dispatched on a runtime element type.
cudaError_t launchDflashAttention(DflashAttentionParams const& params, DataType type, void* workspace,
    size_t workspaceSize, cudaStream_t stream);

} // namespace dflash

#endif // DFLASH_ATTENTION_KERNEL_H
