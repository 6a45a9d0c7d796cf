// The parts of a native decoder forward that llama_decoder.cpp (a Llama target) and draft_decoder.cpp (a DFlash
// drafter) share: RMSNorm in torch's addition order, RoPE, SiLU(gate) * up. See decoder_parts.h.
//
// Built with -ffp-contract=off: no product and sum may be fused into one rounding.

#include "decoder_parts.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dflash_cpu {
namespace {

int ceilLog2(int64_t x) {
    if (x <= 2) return 1;
    int bits = 0;
    for (uint64_t v = static_cast<uint64_t>(x - 1); v; v >>= 1) ++bits;
    return bits;
}

// sum(x[0..n)) in the order torch's CPU sum kernel adds a contiguous row of float32 with `lanes`-float vectors
// (vectorized_inner_sum -> row_sum -> multi_row_sum): n >= lanes.
float torchRowSum(const float* x, int64_t n, int lanes) {
    constexpr int kIlp = 4, kLevels = 4;
    const int64_t vectors = n / lanes, rows = vectors / kIlp;
    float acc[kLevels][kIlp][kMaxLanes] = {};
    auto addVector = [&](float* into, int64_t vector) {
        for (int l = 0; l < lanes; ++l) into[l] += x[vector * lanes + l];
    };
    const int levelPower = std::max(4, ceilLog2(rows) / kLevels);
    const int64_t levelStep = int64_t{1} << levelPower, levelMask = levelStep - 1;
    int64_t i = 0;
    while (i + levelStep <= rows) {
        for (int64_t j = 0; j < levelStep; ++j, ++i) {
            for (int k = 0; k < kIlp; ++k) addVector(acc[0][k], i * kIlp + k);
        }
        for (int j = 1; j < kLevels; ++j) {
            for (int k = 0; k < kIlp; ++k) {
                for (int l = 0; l < lanes; ++l) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            }
            if ((i & (levelMask << (j * levelPower))) != 0) break;
        }
    }
    for (; i < rows; ++i) {
        for (int k = 0; k < kIlp; ++k) addVector(acc[0][k], i * kIlp + k);
    }
    for (int j = 1; j < kLevels; ++j) {
        for (int k = 0; k < kIlp; ++k) {
            for (int l = 0; l < lanes; ++l) acc[0][k][l] += acc[j][k][l];
        }
    }
    for (int64_t v = rows * kIlp; v < vectors; ++v) addVector(acc[0][0], v);
    for (int k = 1; k < kIlp; ++k) {
        for (int l = 0; l < lanes; ++l) acc[0][0][l] += acc[0][k][l];
    }
    float total = 0.0f;
    for (int64_t e = vectors * lanes; e < n; ++e) total += x[e];
    for (int l = 0; l < lanes; ++l) total += acc[0][0][l];
    return total;
}

#if DFLASH_X86
__attribute__((target("avx512f")))
void siluMulAvx512(const float* gate, const float* up, int64_t n, float* out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u);
        const __m512 g = _mm512_maskz_loadu_ps(live, gate + i);
        const __m512 negated = _mm512_sub_ps(_mm512_setzero_ps(), g);
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, Sleef_expf16_u10(negated)));
        _mm512_mask_storeu_ps(out + i, live, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(live, up + i)));
    }
}
#endif

}  // namespace

// LlamaRMSNorm of `rows` rows of n floats: out = w * (x * rsqrt(mean(x^2) + eps)).
void rmsNorm(const float* x, const float* w, int64_t rows, int64_t n, float eps, int lanes, float* out) {
    std::vector<float> squares(n);
    for (int64_t m = 0; m < rows; ++m) {
        const float* row = x + m * n;
        for (int64_t i = 0; i < n; ++i) squares[i] = row[i] * row[i];
        const float mean = torchRowSum(squares.data(), n, lanes) / static_cast<float>(n);
        const float inverse = 1.0f / std::sqrt(mean + eps);
        for (int64_t i = 0; i < n; ++i) out[m * n + i] = w[i] * (row[i] * inverse);
    }
}

// q * cos + rotate_half(q) * sin over one head of `dim` floats, in place.
void rope(float* q, const float* cos, const float* sin, int64_t dim) {
    const int64_t half = dim / 2;
    float rotated[256];
    for (int64_t i = 0; i < half; ++i) {
        rotated[i] = -q[i + half];
        rotated[i + half] = q[i];
    }
    for (int64_t i = 0; i < dim; ++i) {
        const float a = q[i] * cos[i], b = rotated[i] * sin[i];
        q[i] = a + b;
    }
}

// silu(gate) * up for n floats (gate and up of one row). Wherever the CPU has AVX512 torch's silu takes its AVX512
// path, so this does too, whether or not tests switched our own kernels' vector paths off.
void siluMul(const float* gate, const float* up, int64_t n, float* out) {
#if DFLASH_X86
    static const bool avx512 = __builtin_cpu_supports("avx512f");
    if (avx512) {
        siluMulAvx512(gate, up, n, out);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace dflash_cpu
