/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CPU twin of the DFlash draft-attention op: the same maths as the CUDA kernels (fp32 RoPE, fp32 softmax and
 * accumulation, 16-bit values rounded where the kernels round them). It is the numerical reference of the kernels
 * and the body of the onnxruntime custom op.
 */
#ifndef DFLASH_ATTENTION_CPU_H
#define DFLASH_ATTENTION_CPU_H

#include "dflashAttentionParams.h"

#include <string>

namespace dflash
{

//! Empty string when the per-call shapes and lengths are consistent, else a one-line message.
//! Reads cacheLens/ctxLens, so they must be host pointers.
std::string validateCall(DflashAttentionParams const& params);

//! Run the op on host memory: writes the new context rows into the cache and the attention into out.
//! T is float, Fp16 or Bf16. Returns an empty string on success, else the validation message.
template <typename T>
std::string dflashAttentionCpu(DflashAttentionParams const& params);

//! dflashAttentionCpu dispatched on a runtime element type.
std::string dflashAttentionCpu(DflashAttentionParams const& params, DataType type);

} // namespace dflash

#endif // DFLASH_ATTENTION_CPU_H
