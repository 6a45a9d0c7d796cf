// What the native decoder forwards share (decoder_parts.cpp): the layer arithmetic of llama_decoder.cpp, which
// reproduces transformers' Llama bit for bit, reused by draft_decoder.cpp.
#pragma once

#include "cpu_kernels.h"

#include <ATen/ATen.h>

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
// torch's own vectorized exp (exported by libtorch_cpu): what torch.nn.functional.silu calls on AVX512.
extern "C" __m512 Sleef_expf16_u10(__m512);
#define DFLASH_X86 1
#else
#define DFLASH_X86 0
#endif

namespace dflash_cpu {

// The widest vector torch's CPU sum kernel uses (floats); rmsNorm's `lanes` is at most this.
constexpr int kMaxLanes = 16;

// LlamaRMSNorm of `rows` rows of n floats: out = w * (x * rsqrt(mean(x^2) + eps)), the sum of squares added in the
// order torch's CPU sum kernel adds with `lanes`-float vectors (n >= lanes). out may be x.
void rmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, int lanes, float* out);

// q * cos + rotate_half(q) * sin over one head of `dim` (<= 256) floats, in place.
void rope(float* q, const float* cos, const float* sin, int64_t dim);

// silu(gate) * up for n floats, with the exp torch's own silu calls.
void siluMul(const float* gate, const float* up, int64_t n, float* out);

// One block-quantized weight of a layer, as weights[] lists it: codes, d, o.
struct Weight {
    const at::Tensor* codes;
    const at::Tensor* d;
    const at::Tensor* o;
    int64_t bits;
    int64_t n;
    at::Tensor operator()(const at::Tensor& x) const { return dflash_cpu::blockMatmul(x, *codes, *d, *o, bits, n); }
};

}  // namespace dflash_cpu
