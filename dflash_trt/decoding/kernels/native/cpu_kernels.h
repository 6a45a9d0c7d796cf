// What cpu_kernels.cpp shares with the other native files (llama_decoder.cpp): the block matmul and one query row's
// attention, each with the batch-invariant arithmetic described there.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace dflash_cpu {

// torch.ops.dflash_cpu.block_matmul: y [..., n] = x [..., K] times the blocks (codes, d, o) of `bits`.
at::Tensor blockMatmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& o,
                       int64_t bits, int64_t n);

// softmax(q . key_l * scale over the keys with mask[l]) . value_l for one query row of `dim` floats; key/value row l
// at keys + l * keyStride (values likewise). scores: room for length + 16 floats.
void attendRow(const float* q, const float* keys, int64_t keyStride, const float* values, int64_t valueStride,
               const bool* mask, int64_t length, int64_t dim, float scale, float* scores, float* out);

// Whether the AVX512 paths run (the CPU has them and tests have not switched them off).
bool vectorPathsOn();

}  // namespace dflash_cpu
