// Batch-invariant CPU kernels for a target at its GGUF precision (see ../block_quant.py and ../rowwise_attention.py).
//
// Lossless speculative decoding needs each row's result to be independent of how many rows are computed with it:
// a verify forward of 8 tokens must give, for every token, the bits a one-token decoding step gives. Both ops here
// compute every output from its own inputs in one fixed order, whatever the number of rows, the batch or the
// thread count (threads split the outputs, never one output's reduction).
//
// block_matmul: y[m, n] = sum_k x[m, k] * w[n, k], w stored as GGUF-style blocks of 32 weights, w = d * c + o
//   with unsigned codes c (4-bit, or 8-bit for Q8_0 as c = q + 128), fp16 scale d and fp16 offset o per block.
//   Each activation row is quantized per block of 32 to int8 (scale amax / 127, round half to even), as
//   llama.cpp's CPU path does, and the block dot products run in int32 (exact), then, block after block,
//     y = (y + (sum_j c_j q_j) * d_b * dx_b) + o_b * (dx_b * sum_j q_j).
// rowwise_attention: softmax(q k^T * scale + mask) v per query row, over the keys its boolean mask allows, in key
//   order.
//
// AVX512-VNNI code runs where the CPU has it; elsewhere a scalar path computes the same formula (in a different but
// equally fixed order: results are reproducible on one machine, not bit-equal across the two paths).

#include "cpu_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define DFLASH_X86 1
#else
#define DFLASH_X86 0
#endif

namespace {

constexpr int64_t kBlock = 32;  // weights per scale

// False makes every op take its scalar path (tests run both paths on one machine).
std::atomic<bool> vectorEnabled{true};

bool cpuHasAvx512() {
#if DFLASH_X86
    static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    return has && vectorEnabled.load();
#else
    return false;
#endif
}

bool cpuHasVnni() {
#if DFLASH_X86
    static const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
    return has && cpuHasAvx512();
#else
    return false;
#endif
}

// ---- activations: int8 per block of 32 ----

struct QuantizedRows {
    std::vector<int8_t> q;   // [M, k]
    std::vector<float> dx;   // [M, blocks]: amax / 127
    std::vector<float> sx;   // [M, blocks]: dx * sum(q)
    int64_t k = 0;           // a multiple of 32 (block_matmul checks it)
    int64_t blocks = 0;
};

// One block of 32 activations: int8 codes, returns their sum; scalar and AVX512 give the same bits (the same IEEE
// operations: |x| maximum, 127 / amax, x * inverse rounded half to even).
int32_t quantizeBlockScalar(const float* src, int8_t* dst, float* dx) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(src[j] * inverse));
        dst[j] = static_cast<int8_t>(v);
        sum += v;
    }
    *dx = amax / 127.0f;
    return sum;
}

#if DFLASH_X86
__attribute__((target("avx512f,avx512bw,avx512vl")))
int32_t quantizeBlockAvx512(const float* src, int8_t* dst, float* dx) {
    const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    // cvtps rounds half to even under the default rounding mode, as nearbyint does.
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inverse));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inverse));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(qb));
    *dx = amax / 127.0f;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}
#endif

// Quantizes into `out`, whose buffers are reused from call to call (every element is written).
void quantizeRows(const float* x, int64_t rows, int64_t k, QuantizedRows& out) {
    out.k = k;
    out.blocks = k / kBlock;
    out.q.resize(rows * k);
    out.dx.resize(rows * out.blocks);
    out.sx.resize(rows * out.blocks);
#if DFLASH_X86
    const bool wide = cpuHasAvx512();
#endif
    for (int64_t m = 0; m < rows; ++m) {
        for (int64_t b = 0; b < out.blocks; ++b) {
            const float* src = x + m * k + b * kBlock;
            int8_t* dst = out.q.data() + m * k + b * kBlock;
            float* dx = out.dx.data() + m * out.blocks + b;
            int32_t sum;
#if DFLASH_X86
            if (wide) {
                sum = quantizeBlockAvx512(src, dst, dx);
            } else
#endif
            {
                sum = quantizeBlockScalar(src, dst, dx);
            }
            out.sx[m * out.blocks + b] = *dx * static_cast<float>(sum);
        }
    }
}

// ---- block matmul ----
//
// Weight layout: output rows in groups of 16 (one per vector lane). Group g, block b holds the 16 rows' 32 codes
// as vectors of 64 bytes where byte 4l + i is lane l's code 4v + i (v the vector's index in the block):
//   bits 8: 8 vectors, v = 0..7;
//   bits 4: 4 vectors, the low nibble for v = 0..3 and the high nibble for v = 4..7.
// Scales d and offsets o: [groups, blocks, 16] float16. One AVX512-VNNI dot-product instruction then multiplies
// 4 codes of each of 16 rows by the same 4 activations (broadcast), and a block's integer sums need no float
// work until the block ends: per row, per block of 16 x 32 weights, 8 integer instructions and 3 float ones.

struct BlockWeight {
    const uint8_t* codes;  // [groups, blocks, 16 * 32 * bits / 8]
    const uint16_t* d;     // [groups, blocks, 16] fp16
    const uint16_t* o;     // [groups, blocks, 16] fp16
    int64_t groups;
    int64_t blocks;
    int bits;
    int64_t blockBytes() const { return 16 * kBlock * bits / 8; }
};

constexpr int64_t kLanes = 16;

inline float halfToFloat(uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }

inline uint8_t codeAt(const BlockWeight& w, int64_t g, int64_t b, int64_t lane, int64_t k) {
    const uint8_t* block = w.codes + (g * w.blocks + b) * w.blockBytes();
    if (w.bits == 8) return block[(k / 4) * 64 + lane * 4 + k % 4];
    const uint8_t byte = block[((k % 16) / 4) * 64 + lane * 4 + k % 4];
    return k < 16 ? (byte & 0x0F) : (byte >> 4);
}

void blockGroupScalar(const BlockWeight& w, int64_t g, const QuantizedRows& a, int64_t rows, float* y, int64_t ldy,
                      int64_t n) {
    for (int64_t m = 0; m < rows; ++m) {
        for (int64_t lane = 0; lane < kLanes && g * kLanes + lane < n; ++lane) {
            float acc = 0.0f;
            for (int64_t b = 0; b < w.blocks; ++b) {
                int32_t isum = 0;
                const int8_t* q = a.q.data() + m * a.k + b * kBlock;
                for (int64_t j = 0; j < kBlock; ++j) isum += static_cast<int32_t>(codeAt(w, g, b, lane, j)) * q[j];
                const int64_t s = (g * w.blocks + b) * kLanes + lane;
                acc = acc + static_cast<float>(isum) * halfToFloat(w.d[s]) * a.dx[m * a.blocks + b];
                acc = acc + halfToFloat(w.o[s]) * a.sx[m * a.blocks + b];
            }
            y[m * ldy + g * kLanes + lane] = acc;
        }
    }
}

#if DFLASH_X86
// How many groups of 16 output rows ahead the kernel fetches weights.
constexpr int64_t kPrefetchGroups = 2;

// `Tile` activation rows against one group of 16 weight rows: each unpacked weight block is reused from registers.
template <int Tile>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma"), always_inline))
inline void blockTileVnni(const BlockWeight& w, int64_t g, const QuantizedRows& a, int64_t m0, float* y, int64_t ldy,
                          int64_t n) {
    const __m512i lowNibbles = _mm512_set1_epi8(0x0F);
    __m512 acc[Tile];
    for (int r = 0; r < Tile; ++r) acc[r] = _mm512_setzero_ps();
    // The first tile of a group fetches the same block of the group kPrefetchGroups ahead into the cache: with
    // several rows the kernel computes long enough per group for the weights to stream in meanwhile, instead of
    // the compute and the memory reads taking turns (a verify forward reads ~100 MB of weights).
    const bool prefetch = m0 == 0 && g + kPrefetchGroups < w.groups;
    for (int64_t b = 0; b < w.blocks; ++b) {
        const uint8_t* block = w.codes + (g * w.blocks + b) * w.blockBytes();
        if (prefetch) {
            const int64_t ahead = ((g + kPrefetchGroups) * w.blocks + b);
            const char* codes = reinterpret_cast<const char*>(w.codes + ahead * w.blockBytes());
            for (int64_t line = 0; line < w.blockBytes(); line += 64) _mm_prefetch(codes + line, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(w.d + ahead * kLanes), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(w.o + ahead * kLanes), _MM_HINT_T0);
        }
        __m512i wv[8];
        if (w.bits == 4) {
            for (int v = 0; v < 4; ++v) {
                const __m512i packed = _mm512_loadu_si512(block + 64 * v);
                wv[v] = _mm512_and_si512(packed, lowNibbles);
                wv[v + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), lowNibbles);
            }
        } else {
            for (int v = 0; v < 8; ++v) wv[v] = _mm512_loadu_si512(block + 64 * v);
        }
        const int64_t s = (g * w.blocks + b) * kLanes;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + s)));
        const __m512 o = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.o + s)));
        for (int r = 0; r < Tile; ++r) {
            const int64_t m = m0 + r;
            const int8_t* q = a.q.data() + m * a.k + b * kBlock;
            // Two independent chains of dot-product instructions (their latency, not their count, is the limit);
            // integer sums are exact, so how they are split does not change the result.
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            for (int v = 0; v < 8; v += 2) {
                even = _mm512_dpbusd_epi32(even, wv[v], _mm512_broadcastd_epi32(_mm_loadu_si32(q + 4 * v)));
                odd = _mm512_dpbusd_epi32(odd, wv[v + 1], _mm512_broadcastd_epi32(_mm_loadu_si32(q + 4 * v + 4)));
            }
            const __m512i isum = _mm512_add_epi32(even, odd);
            // Per lane, the same sequence as the scalar path: (isum * d) * dx, then + o * sx.
            const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d);
            acc[r] = _mm512_fmadd_ps(scaled, _mm512_set1_ps(a.dx[m * a.blocks + b]), acc[r]);
            acc[r] = _mm512_fmadd_ps(o, _mm512_set1_ps(a.sx[m * a.blocks + b]), acc[r]);
        }
    }
    const int64_t live = std::min<int64_t>(kLanes, n - g * kLanes);
    const __mmask16 mask = static_cast<__mmask16>(live == 16 ? 0xFFFF : (1u << live) - 1u);
    for (int r = 0; r < Tile; ++r) _mm512_mask_storeu_ps(y + (m0 + r) * ldy + g * kLanes, mask, acc[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
void blockGroupVnni(const BlockWeight& w, int64_t g, const QuantizedRows& a, int64_t rows, float* y, int64_t ldy,
                    int64_t n) {
    // Every row goes through the same per-row operations whichever tile holds it: results are batch-invariant.
    int64_t m0 = 0;
    for (; m0 + 4 <= rows; m0 += 4) blockTileVnni<4>(w, g, a, m0, y, ldy, n);
    switch (rows - m0) {
        case 3: blockTileVnni<3>(w, g, a, m0, y, ldy, n); break;
        case 2: blockTileVnni<2>(w, g, a, m0, y, ldy, n); break;
        case 1: blockTileVnni<1>(w, g, a, m0, y, ldy, n); break;
        default: break;
    }
}
#endif

at::Tensor blockMatmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& o,
                       int64_t bits, int64_t n) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "block_matmul: x must be float32 on CPU");
    TORCH_CHECK(bits == 4 || bits == 8, "block_matmul: bits must be 4 or 8");
    TORCH_CHECK(d.scalar_type() == at::kHalf && o.scalar_type() == at::kHalf && d.is_contiguous()
                && o.is_contiguous() && d.sizes() == o.sizes() && d.dim() == 3 && d.size(2) == kLanes,
                "block_matmul: d and o must be contiguous float16 [groups, blocks, 16]");
    const int64_t groups = d.size(0), blocks = d.size(1);
    TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous()
                && codes.numel() == groups * blocks * 16 * kBlock * bits / 8,
                "block_matmul: codes must be contiguous uint8, ", groups * blocks * 16 * kBlock * bits / 8, " bytes");
    TORCH_CHECK(n > (groups - 1) * kLanes && n <= groups * kLanes, "block_matmul: n does not fit the groups");
    const int64_t k = x.size(-1);
    TORCH_CHECK(k == blocks * kBlock, "block_matmul: x has ", k, " features, the weights ", blocks * kBlock);
    const at::Tensor rows2d = x.reshape({-1, k}).contiguous();
    const int64_t rows = rows2d.size(0);
    std::vector<int64_t> outShape(x.sizes().begin(), x.sizes().end());
    outShape.back() = n;
    at::Tensor y = at::empty({rows, n}, x.options());
    if (rows == 0) return y.reshape(outShape);
    // The calling thread's buffers: a decoding step calls this ~200 times, allocations would show.
    thread_local QuantizedRows a;
    quantizeRows(rows2d.data_ptr<float>(), rows, k, a);
    const BlockWeight w{codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>()),
                        reinterpret_cast<const uint16_t*>(o.data_ptr<at::Half>()), groups, blocks,
                        static_cast<int>(bits)};
    float* out = y.data_ptr<float>();
    const bool vnni = cpuHasVnni();
    at::parallel_for(0, groups, 4, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
#if DFLASH_X86
            if (vnni) {
                blockGroupVnni(w, g, a, rows, out, n, n);
                continue;
            }
#endif
            blockGroupScalar(w, g, a, rows, out, n, n);
        }
    });
    return y.reshape(outShape);
}

// ---- attention, one query row at a time ----

#if DFLASH_X86
// exp(x) for x <= 0 (scores minus their maximum): Cody-Waite reduction and a degree-6 polynomial, the same
// instructions for every lane, so a score's weight does not depend on where it sits in the row.
__attribute__((target("avx512f,fma")))
inline __m512 expNonPositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx512f,fma")))
void attendRowAvx512(const float* q, const float* keys, int64_t keyStride, const float* values, int64_t valueStride,
                     const bool* mask, int64_t length, int64_t dim, float scale, float* scores, float* out) {
    // dim is a multiple of 16 here; a score is one fixed chain of fused multiply-adds over dim.
    float best = -std::numeric_limits<float>::infinity();
    int64_t visible = 0;
    for (int64_t l = 0; l < length; ++l) {
        if (!mask[l]) continue;
        const float* key = keys + l * keyStride;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < dim; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(key + i), acc);
        const float s = _mm512_reduce_add_ps(acc) * scale;
        scores[visible++] = s;
        best = std::max(best, s);
    }
    if (visible == 0) {
        std::fill(out, out + dim, 0.0f);
        return;
    }
    // exp of every visible score, 16 at a time (the tail zero-padded), then one sequential pass over the keys.
    for (int64_t i = 0; i < visible; i += 16) {
        const __mmask16 live = static_cast<__mmask16>(visible - i >= 16 ? 0xFFFF : (1u << (visible - i)) - 1u);
        const __m512 s = _mm512_maskz_loadu_ps(live, scores + i);
        _mm512_mask_storeu_ps(scores + i, live, expNonPositive(_mm512_sub_ps(s, _mm512_set1_ps(best))));
    }
    float total = 0.0f;
    __m512 acc[8];
    const int64_t chunks = dim / 16;
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
    int64_t index = 0;
    for (int64_t l = 0; l < length; ++l) {
        if (!mask[l]) continue;
        const float p = scores[index++];
        total += p;
        const __m512 pv = _mm512_set1_ps(p);
        const float* value = values + l * valueStride;
        for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(value + 16 * c), acc[c]);
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / total);
    for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(acc[c], inverse));
}
#endif

void attendRowScalar(const float* q, const float* keys, int64_t keyStride, const float* values, int64_t valueStride,
                     const bool* mask, int64_t length, int64_t dim, float scale, float* scores, float* out) {
    float best = -std::numeric_limits<float>::infinity();
    int64_t visible = 0;
    for (int64_t l = 0; l < length; ++l) {
        if (!mask[l]) continue;
        float s = 0.0f;
        for (int64_t i = 0; i < dim; ++i) s += q[i] * keys[l * keyStride + i];
        scores[visible++] = s * scale;
        best = std::max(best, s * scale);
    }
    std::fill(out, out + dim, 0.0f);
    if (visible == 0) return;
    float total = 0.0f;
    int64_t index = 0;
    for (int64_t l = 0; l < length; ++l) {
        if (!mask[l]) continue;
        const float p = std::exp(scores[index++] - best);
        total += p;
        for (int64_t i = 0; i < dim; ++i) out[i] += p * values[l * valueStride + i];
    }
    const float inverse = 1.0f / total;
    for (int64_t i = 0; i < dim; ++i) out[i] *= inverse;
}

at::Tensor rowwiseAttention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& mask, double scale) {
    TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask.dim() == 4,
                "rowwise_attention: query [B,Hq,T,D], key/value [B,Hkv,L,D], mask [B,1|Hq,T,L]");
    TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat
                && value.scalar_type() == at::kFloat && mask.scalar_type() == at::kBool,
                "rowwise_attention: float32 query/key/value and a bool mask");
    const int64_t batch = query.size(0), heads = query.size(1), length = query.size(2), dim = query.size(3);
    const int64_t kvHeads = key.size(1), keys = key.size(2);
    TORCH_CHECK(heads % kvHeads == 0 && key.sizes() == value.sizes() && key.size(0) == batch && key.size(3) == dim,
                "rowwise_attention: mismatched shapes");
    TORCH_CHECK(mask.size(0) == batch && (mask.size(1) == 1 || mask.size(1) == heads) && mask.size(2) == length
                && mask.size(3) == keys, "rowwise_attention: mask shape ", mask.sizes(), " does not fit");
    const at::Tensor q = query.contiguous();
    const at::Tensor k = key.stride(3) == 1 ? key : key.contiguous();
    const at::Tensor v = value.stride(3) == 1 ? value : value.contiguous();
    const at::Tensor visible = mask.contiguous();
    at::Tensor out = at::empty({batch, heads, length, dim}, query.options());
    const float* qp = q.data_ptr<float>();
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    const bool* mp = visible.data_ptr<bool>();
    float* op = out.data_ptr<float>();
    const int64_t groups = heads / kvHeads, maskHeads = visible.size(1);
    at::parallel_for(0, batch * heads * length, 8, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(keys + 16);
        for (int64_t item = begin; item < end; ++item) {
            const int64_t b = item / (heads * length), h = (item / length) % heads, t = item % length;
            const float* keyRow = kp + b * k.stride(0) + (h / groups) * k.stride(1);
            const float* valueRow = vp + b * v.stride(0) + (h / groups) * v.stride(1);
            const bool* maskRow = mp + ((b * maskHeads + (maskHeads == 1 ? 0 : h)) * length + t) * keys;
            const float* qRow = qp + ((b * heads + h) * length + t) * dim;
            float* outRow = op + ((b * heads + h) * length + t) * dim;
            dflash_cpu::attendRow(qRow, keyRow, k.stride(2), valueRow, v.stride(2), maskRow, keys, dim,
                                  static_cast<float>(scale), scores.data(), outRow);
        }
    });
    return out;
}

// ---- argmax of each row ----
//
// torch.argmax over the last axis of float32 rows, ~10x faster on CPU: a greedy choice over a 49152-token vocabulary
// took ~26 us a row, 15 rows per DFlash step. The same index as torch's: the first maximum, or the first NaN in a
// row that holds one (torch ranks NaN above every number).

#if DFLASH_X86
__attribute__((target("avx512f")))
bool rowMaxAvx512(const float* x, int64_t n, float* best) {
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __mmask16 nan = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u);
        const __m512 v = _mm512_mask_loadu_ps(top, live, x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        top = _mm512_max_ps(top, v);
    }
    *best = _mm512_reduce_max_ps(top);
    return nan == 0;
}
#endif

at::Tensor argmaxRows(const at::Tensor& x) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) > 0, "argmax_rows: float32 [..., n > 0]");
    const at::Tensor rows = x.contiguous();
    const int64_t n = x.size(-1), count = rows.numel() / n;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
    at::Tensor out = at::empty(shape, x.options().dtype(at::kLong));
    const float* xp = rows.data_ptr<float>();
    int64_t* op = out.data_ptr<int64_t>();
    for (int64_t r = 0; r < count; ++r) {
        const float* row = xp + r * n;
        float best = -std::numeric_limits<float>::infinity();
        bool finite = true;
#if DFLASH_X86
        if (cpuHasAvx512()) {
            finite = rowMaxAvx512(row, n, &best);
        } else
#endif
        {
            for (int64_t i = 0; i < n; ++i) {
                if (std::isnan(row[i])) finite = false;
                best = std::max(best, row[i]);
            }
        }
        int64_t index = 0;
        if (finite) {
            while (row[index] != best) ++index;  // the first maximum (-0.0 == 0.0, as torch's comparison has it)
        } else {
            while (!std::isnan(row[index])) ++index;
        }
        op[r] = index;
    }
    return out;
}

bool hasVnni() { return cpuHasVnni(); }

void useVectorKernels(bool enabled) { vectorEnabled.store(enabled); }

}  // namespace

namespace dflash_cpu {

at::Tensor blockMatmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& o,
                       int64_t bits, int64_t n) {
    return ::blockMatmul(x, codes, d, o, bits, n);
}

void attendRow(const float* q, const float* keys, int64_t keyStride, const float* values, int64_t valueStride,
               const bool* mask, int64_t length, int64_t dim, float scale, float* scores, float* out) {
#if DFLASH_X86
    if (dim % 16 == 0 && dim <= 128 && cpuHasAvx512()) {
        attendRowAvx512(q, keys, keyStride, values, valueStride, mask, length, dim, scale, scores, out);
        return;
    }
#endif
    attendRowScalar(q, keys, keyStride, values, valueStride, mask, length, dim, scale, scores, out);
}

bool vectorPathsOn() { return cpuHasAvx512(); }

}  // namespace dflash_cpu

TORCH_LIBRARY(dflash_cpu, m) {
    m.def("block_matmul(Tensor x, Tensor codes, Tensor d, Tensor o, int bits, int n) -> Tensor");
    m.def("rowwise_attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
    m.def("argmax_rows(Tensor x) -> Tensor");
    m.def("has_vnni() -> bool", hasVnni);
    m.def("use_vector_kernels(bool enabled) -> ()", useVectorKernels);
}

TORCH_LIBRARY_IMPL(dflash_cpu, CPU, m) {
    m.impl("block_matmul", blockMatmul);
    m.impl("rowwise_attention", rowwiseAttention);
    m.impl("argmax_rows", argmaxRows);
}

