// The layers of a DFlash drafter whose linear layers are Q8_0 blocks, in one call (see
// ../../model/drafters/native_layers.py).
//
// A draft forward of the demo drafter (two layers) through its torch modules is ~150 small torch calls (norms, RoPE,
// the cache append, the attention's concatenations and masks) at a few microseconds each: on one core ~1.5 ms of a
// ~2.2 ms draft, against ~0.3 ms of matmuls. This op runs every layer of a draft forward (the block's rows and the new
// context rows of every sequence of the batch) with no Python in between:
//   - per layer: input RMSNorm of the block; q from the block, k/v from the block AND the new context rows (KV
//     injection: the same k_proj/v_proj, the context not normed), one block matmul for q and one for k/v over both;
//     per-head q_norm/k_norm; RoPE at the block's and the context's positions; the context's keys and values
//     appended to the layer's cache; each block query attends over the sequence's cached context and the block's
//     own valid slots (not causal); o_proj and the residual; the MLP as in llama_decoder.cpp.
//   - the fused context (fc + hidden_norm), the final norm and the output head stay in Python (one call each).
// It computes the torch forward's formula (model/drafters/base.py) with its own summation order in the attention,
// so its states differ from the torch forward's by float rounding: drafts are proposals the target verifies, so
// the output does not change (tests/core/test_core_native_drafter.py bounds the difference and checks losslessness).
//
// Built with -ffp-contract=off: no product and sum may be fused into one rounding.

#include "decoder_parts.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using dflash_cpu::kMaxLanes;
using dflash_cpu::rmsNorm;
using dflash_cpu::rope;
using dflash_cpu::siluMul;
using dflash_cpu::Weight;

// Keys and values of one KV head: `length` rows, row l at keys + l * stride (values likewise).
struct KeyRows {
    const float* keys;
    const float* values;
    int64_t stride;
    int64_t length;
};

float dot(const float* a, const float* b, int64_t dim) {
    float s = 0.0f;
    for (int64_t i = 0; i < dim; ++i) s += a[i] * b[i];
    return s;
}

#if DFLASH_X86
__attribute__((target("avx512f,fma")))
float dotAvx512(const float* a, const float* b, int64_t dim) {  // dim: a multiple of 16
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    return _mm512_reduce_add_ps(acc);
}

__attribute__((target("avx512f")))
void expShifted(float* scores, int64_t n, float best) {  // scores[i] = exp(scores[i] - best)
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u);
        const __m512 s = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores + i), _mm512_set1_ps(best));
        _mm512_mask_storeu_ps(scores + i, live, Sleef_expf16_u10(s));
    }
}

__attribute__((target("avx512f,fma")))
void weightedSumAvx512(const float* probs, const KeyRows* parts, int count, int64_t dim, float* out) {
    __m512 acc[16];
    const int64_t chunks = dim / 16;
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
    for (int p = 0; p < count; ++p) {
        for (int64_t l = 0; l < parts[p].length; ++l) {
            const __m512 weight = _mm512_set1_ps(*probs++);
            const float* value = parts[p].values + l * parts[p].stride;
            for (int64_t c = 0; c < chunks; ++c) {
                acc[c] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 16 * c), acc[c]);
            }
        }
    }
    for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}
#endif

// softmax(q . k * scale) . v over the rows of `parts` in turn (every row visible); scores: room for all rows.
void attend(const float* q, const KeyRows* parts, int count, int64_t dim, float scale, float* scores, float* out) {
#if DFLASH_X86
    const bool vector = dflash_cpu::vectorPathsOn() && dim % 16 == 0 && dim <= 256;
#else
    const bool vector = false;
#endif
    int64_t n = 0;
    float best = -std::numeric_limits<float>::infinity();
    for (int p = 0; p < count; ++p) {
        for (int64_t l = 0; l < parts[p].length; ++l) {
            const float* key = parts[p].keys + l * parts[p].stride;
#if DFLASH_X86
            const float s = (vector ? dotAvx512(q, key, dim) : dot(q, key, dim)) * scale;
#else
            const float s = dot(q, key, dim) * scale;
#endif
            scores[n++] = s;
            best = std::max(best, s);
        }
    }
    std::fill(out, out + dim, 0.0f);
    if (n == 0) return;
    float total = 0.0f;
#if DFLASH_X86
    if (vector) {
        expShifted(scores, n, best);
        for (int64_t i = 0; i < n; ++i) total += scores[i];
        weightedSumAvx512(scores, parts, count, dim, out);
    }
#endif
    if (!vector) {
        for (int64_t i = 0; i < n; ++i) total += (scores[i] = std::exp(scores[i] - best));
        const float* probs = scores;
        for (int p = 0; p < count; ++p) {
            for (int64_t l = 0; l < parts[p].length; ++l) {
                const float weight = *probs++;
                const float* value = parts[p].values + l * parts[p].stride;
                for (int64_t i = 0; i < dim; ++i) out[i] += weight * value[i];
            }
        }
    }
    const float inverse = 1.0f / total;
    for (int64_t i = 0; i < dim; ++i) out[i] *= inverse;
}

// Per layer: in_norm, q (codes, d, o), k|v stacked (3), o (3), q_norm, k_norm, post_norm, gate|up stacked (3),
// down (3).
constexpr int64_t kTensorsPerLayer = 19;
constexpr int64_t kBitsPerLayer = 5;  // q, kv, o, gate_up, down

const float* floats(const at::Tensor& t, int64_t numel, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == numel, "draft_decoder: ", what,
                " must be ", numel, " contiguous float32 values");
    return t.data_ptr<float>();
}

at::Tensor draftDecoder(const at::Tensor& hidden, const at::Tensor& context, at::TensorList weights,
                        at::IntArrayRef bits, const at::Tensor& blockCos, const at::Tensor& blockSin,
                        const at::Tensor& contextCos, const at::Tensor& contextSin, at::TensorList keys,
                        at::TensorList values, const at::Tensor& cacheLens, const at::Tensor& contextLens,
                        const at::Tensor& blockLens, at::IntArrayRef dims, double eps, double scale, int64_t lanes) {
    TORCH_CHECK(dims.size() == 4, "draft_decoder: dims = [heads, kv_heads, head_dim, intermediate]");
    const int64_t heads = dims[0], kvHeads = dims[1], headDim = dims[2], inter = dims[3];
    const int64_t layers = static_cast<int64_t>(keys.size());
    TORCH_CHECK(hidden.dim() == 3 && context.dim() == 3 && hidden.size(0) == context.size(0)
                && hidden.size(2) == context.size(2), "draft_decoder: hidden [B, S, D] and context [B, C, D]");
    const int64_t batch = hidden.size(0), slots = hidden.size(1), dModel = hidden.size(2), numContext = context.size(1);
    const int64_t blockRows = batch * slots, contextRows = batch * numContext;
    TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kTensorsPerLayer && values.size() == keys.size()
                && static_cast<int64_t>(bits.size()) == layers * kBitsPerLayer, "draft_decoder: ", kTensorsPerLayer,
                " weight tensors and ", kBitsPerLayer, " bit widths per layer, one key and value buffer per layer");
    TORCH_CHECK(lanes >= 1 && lanes <= kMaxLanes && dModel >= lanes && headDim >= lanes && headDim <= 256
                && headDim % 2 == 0 && heads % kvHeads == 0, "draft_decoder: unsupported shapes");
    const float* bc = floats(blockCos, blockRows * headDim, "block cos");
    const float* bs = floats(blockSin, blockRows * headDim, "block sin");
    const float* cc = floats(contextCos, contextRows * headDim, "context cos");
    const float* cs = floats(contextSin, contextRows * headDim, "context sin");
    for (const at::Tensor* lens : {&cacheLens, &contextLens, &blockLens}) {
        TORCH_CHECK(lens->scalar_type() == at::kLong && lens->is_contiguous() && lens->numel() == batch,
                    "draft_decoder: cache, context and block lengths [B] int64");
    }
    const int64_t* cached = cacheLens.data_ptr<int64_t>();
    const int64_t* newRows = contextLens.data_ptr<int64_t>();
    const int64_t* valid = blockLens.data_ptr<int64_t>();
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) {
        TORCH_CHECK(cached[b] >= 0 && newRows[b] >= 0 && newRows[b] <= numContext && valid[b] >= 1
                    && valid[b] <= slots, "draft_decoder: lengths out of range");
        longest = std::max(longest, cached[b] + newRows[b]);
    }
    for (int64_t l = 0; l < layers; ++l) {
        for (const at::Tensor& buffer : {keys[l], values[l]}) {
            TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous() && buffer.dim() == 4
                        && buffer.size(0) >= batch && buffer.size(1) == kvHeads && buffer.size(2) >= longest
                        && buffer.size(3) == headDim, "draft_decoder: cache buffers [rows, kv_heads, >= context, "
                        "head_dim] contiguous float32, room for the new context");
        }
    }
    const int64_t qWidth = heads * headDim, kvWidth = kvHeads * headDim;

    at::Tensor x = hidden.reshape({blockRows, dModel}).to(at::kFloat).clone();  // the block's residual stream
    // The k/v projection's input: the block's normed states, then each sequence's new context rows (the same in
    // every layer), packed: rows past a sequence's count are padding (a catch-up pads every sequence to the longest
    // backlog), so they are left out. source[r]: the packed row r's index in the [B * C] context.
    std::vector<int64_t> source;
    for (int64_t s = 0; s < batch; ++s) {
        for (int64_t i = 0; i < newRows[s]; ++i) source.push_back(s * numContext + i);
    }
    const int64_t realRows = static_cast<int64_t>(source.size());
    at::Tensor projected = at::empty({blockRows + realRows, dModel}, x.options());
    const at::Tensor contextIn = context.reshape({contextRows, dModel}).to(at::kFloat).contiguous();
    for (int64_t r = 0; r < realRows; ++r) {
        std::memcpy(projected.data_ptr<float>() + (blockRows + r) * dModel,
                    contextIn.data_ptr<float>() + source[r] * dModel, dModel * sizeof(float));
    }
    at::Tensor normed = projected.narrow(0, 0, blockRows);
    at::Tensor attended = at::empty({blockRows, qWidth}, x.options());
    at::Tensor activated = at::empty({blockRows, inter}, x.options());
    float* xp = x.data_ptr<float>();
    float* np = normed.data_ptr<float>();
    const float epsilon = static_cast<float>(eps);
    const int vectorLanes = static_cast<int>(lanes);

    for (int64_t layer = 0; layer < layers; ++layer) {
        const at::Tensor* w = &weights[layer * kTensorsPerLayer];
        const int64_t* b = bits.data() + layer * kBitsPerLayer;
        const Weight qProj{w + 1, w + 2, w + 3, b[0], qWidth}, kvProj{w + 4, w + 5, w + 6, b[1], 2 * kvWidth};
        const Weight oProj{w + 7, w + 8, w + 9, b[2], dModel};
        const Weight gateUp{w + 13, w + 14, w + 15, b[3], 2 * inter}, down{w + 16, w + 17, w + 18, b[4], dModel};
        const float* qNorm = floats(w[10], headDim, "q_norm");
        const float* kNorm = floats(w[11], headDim, "k_norm");

        rmsNorm(xp, floats(w[0], dModel, "input_layernorm"), blockRows, dModel, epsilon, vectorLanes, np);
        at::Tensor q = qProj(normed);      // [block rows, heads * head_dim]
        at::Tensor kv = kvProj(projected);  // [block rows + new context rows, k | v]
        float* qp = q.data_ptr<float>();
        float* kvp = kv.data_ptr<float>();
        for (int64_t m = 0; m < blockRows; ++m) {
            for (int64_t h = 0; h < heads; ++h) {
                float* head = qp + m * qWidth + h * headDim;
                rmsNorm(head, qNorm, 1, headDim, epsilon, vectorLanes, head);
                rope(head, bc + m * headDim, bs + m * headDim, headDim);
            }
        }
        for (int64_t m = 0; m < blockRows + realRows; ++m) {
            const int64_t at = m < blockRows ? m : source[m - blockRows];  // the row of its cos/sin
            const float* cosRow = (m < blockRows ? bc : cc) + at * headDim;
            const float* sinRow = (m < blockRows ? bs : cs) + at * headDim;
            for (int64_t h = 0; h < kvHeads; ++h) {
                float* head = kvp + m * 2 * kvWidth + h * headDim;
                rmsNorm(head, kNorm, 1, headDim, epsilon, vectorLanes, head);
                rope(head, cosRow, sinRow, headDim);
            }
        }
        // The new context rows join the layer's cache (context row i of sequence b at position cached[b] + i).
        float* kp = keys[layer].data_ptr<float>();
        float* vp = values[layer].data_ptr<float>();
        const int64_t rowStride = keys[layer].stride(0), headStride = keys[layer].stride(1);
        for (int64_t r = 0; r < realRows; ++r) {
            const int64_t s = source[r] / numContext, i = source[r] % numContext;
            const float* row = kvp + (blockRows + r) * 2 * kvWidth;
            for (int64_t h = 0; h < kvHeads; ++h) {
                const int64_t at = s * rowStride + h * headStride + (cached[s] + i) * headDim;
                std::memcpy(kp + at, row + h * headDim, headDim * sizeof(float));
                std::memcpy(vp + at, row + kvWidth + h * headDim, headDim * sizeof(float));
            }
        }
        float* ap = attended.data_ptr<float>();
        const int64_t groups = heads / kvHeads;
        at::parallel_for(0, blockRows * heads, 8, [&](int64_t begin, int64_t end) {
            std::vector<float> scores(longest + slots + 16);
            for (int64_t item = begin; item < end; ++item) {
                const int64_t m = item / heads, h = item % heads, s = m / slots, g = h / groups;
                const int64_t base = s * rowStride + g * headStride;
                const float* blockKeys = kvp + s * slots * 2 * kvWidth + g * headDim;
                const KeyRows parts[2] = {{kp + base, vp + base, headDim, cached[s] + newRows[s]},
                                          {blockKeys, blockKeys + kvWidth, 2 * kvWidth, valid[s]}};
                attend(qp + m * qWidth + h * headDim, parts, 2, headDim, static_cast<float>(scale), scores.data(),
                       ap + m * qWidth + h * headDim);
            }
        });
        const at::Tensor out = oProj(attended);
        const float* op = out.data_ptr<float>();
        for (int64_t i = 0; i < blockRows * dModel; ++i) xp[i] = xp[i] + op[i];

        rmsNorm(xp, floats(w[12], dModel, "post_attention_layernorm"), blockRows, dModel, epsilon, vectorLanes, np);
        const at::Tensor gu = gateUp(normed);  // [block rows, gate | up]
        const float* gp = gu.data_ptr<float>();
        float* actp = activated.data_ptr<float>();
        for (int64_t m = 0; m < blockRows; ++m) {
            siluMul(gp + m * 2 * inter, gp + m * 2 * inter + inter, inter, actp + m * inter);
        }
        const at::Tensor mlp = down(activated);
        const float* dp = mlp.data_ptr<float>();
        for (int64_t i = 0; i < blockRows * dModel; ++i) xp[i] = xp[i] + dp[i];
    }
    return x.reshape({batch, slots, dModel});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dflash_cpu, m) {
    // keys and values: the drafter's context cache buffers, appended in place with the new context rows.
    m.def("draft_decoder(Tensor hidden, Tensor context, Tensor[] weights, int[] bits, Tensor block_cos, "
          "Tensor block_sin, Tensor context_cos, Tensor context_sin, Tensor(a!)[] keys, Tensor(b!)[] values, "
          "Tensor cache_lens, Tensor context_lens, Tensor block_lens, int[] dims, float eps, float scale, int lanes) "
          "-> Tensor");
}

TORCH_LIBRARY_IMPL(dflash_cpu, CPU, m) {
    m.impl("draft_decoder", draftDecoder);
}
