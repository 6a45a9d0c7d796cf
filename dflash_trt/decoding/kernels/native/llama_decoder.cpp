// The decoder layers of a Llama target at its GGUF precision in one call (see ../../model/lean_llama.py).
//
// transformers' Llama forward spends most of a CPU decoding step in Python: ~50 small torch ops per layer, each a
// few microseconds of dispatch. This op runs every decoder layer of a step (a one-token decoding step, a verify
// forward, a batch of either) over the batch KV cache with no Python in between, and computes exactly what
// transformers computes with the block matmul and the rowwise attention in place:
//   - RMSNorm: x * (1 / sqrt(sum(x^2) / D + eps)) * w, the sum added in the order torch's CPU sum kernel adds
//     (SumKernel.cpp: `lanes`-wide vector accumulators, four of them interleaved, cascaded, then the vector's lanes
//     in order), so the norm equals LlamaRMSNorm bit for bit;
//   - RoPE: q * cos + rotate_half(q) * sin, each product rounded before the sum (three torch ops);
//   - SiLU(gate) * up: gate / (1 + exp(-gate)) with the exp torch's vectorized kernel calls (Sleef_expf16_u10);
//   - the projections: block_matmul over q/k/v fused into one weight and gate/up into one (each output row is
//     computed on its own, so fusing changes no bit), attention: attendRow, in key order.
// Every row's result depends on that row (and the cache) alone: the op is batch-invariant like its parts, which
// lossless speculative decoding needs (a verify forward of 8 tokens against a one-token step).
//
// Built with -ffp-contract=off: no product and sum may be fused into one rounding.
#include "decoder_parts.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using dflash_cpu::kMaxLanes;
using dflash_cpu::rmsNorm;
using dflash_cpu::rope;
using dflash_cpu::siluMul;
using dflash_cpu::Weight;

constexpr int64_t kTensorsPerLayer = 14;  // in_norm, qkv (3), o (3), post_norm, gate_up (3), down (3)

std::tuple<at::Tensor, at::Tensor> llamaDecoder(
        const at::Tensor& hidden, at::TensorList weights, at::IntArrayRef bits, const at::Tensor& cos,
        const at::Tensor& sin, at::TensorList keys, at::TensorList values, const at::Tensor& slots,
        const at::Tensor& mask, int64_t width, at::IntArrayRef dims, double eps, double scale, int64_t lanes,
        at::IntArrayRef featureLayers) {
    TORCH_CHECK(dims.size() == 4, "llama_decoder: dims = [heads, kv_heads, head_dim, intermediate]");
    const int64_t heads = dims[0], kvHeads = dims[1], headDim = dims[2], inter = dims[3];
    const int64_t layers = static_cast<int64_t>(keys.size());
    TORCH_CHECK(hidden.dim() == 3 && hidden.scalar_type() == at::kFloat, "llama_decoder: hidden [B, T, D] float32");
    const int64_t batch = hidden.size(0), length = hidden.size(1), dModel = hidden.size(2), rows = batch * length;
    TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kTensorsPerLayer && values.size() == keys.size()
                && static_cast<int64_t>(bits.size()) == layers * 4, "llama_decoder: ", kTensorsPerLayer,
                " weight tensors and 4 bit widths per layer, one key and value buffer per layer");
    TORCH_CHECK(lanes >= 1 && lanes <= kMaxLanes && dModel >= lanes && headDim <= 256 && headDim % 2 == 0
                && heads % kvHeads == 0, "llama_decoder: unsupported shapes");
    TORCH_CHECK(cos.sizes() == sin.sizes() && cos.numel() == rows * headDim && cos.scalar_type() == at::kFloat
                && sin.scalar_type() == at::kFloat, "llama_decoder: cos/sin [B, T, head_dim] float32");
    TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == rows, "llama_decoder: slots [B, T] int64");
    TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 4 && mask.size(0) == batch && mask.size(1) == 1
                && mask.size(2) == length && mask.size(3) >= width, "llama_decoder: mask [B, 1, T, >= width] bool");
    for (int64_t l = 0; l < layers; ++l) {
        for (const at::Tensor& buffer : {keys[l], values[l]}) {
            TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous() && buffer.dim() == 4
                        && buffer.size(0) >= batch && buffer.size(1) == kvHeads && buffer.size(2) >= width
                        && buffer.size(3) == headDim, "llama_decoder: key/value buffers [rows, kv_heads, >= width, "
                        "head_dim] contiguous float32");
        }
    }
    const int64_t qWidth = heads * headDim, kvWidth = kvHeads * headDim, qkvWidth = qWidth + 2 * kvWidth;
    const at::Tensor cosRows = cos.contiguous(), sinRows = sin.contiguous(), slotRows = slots.contiguous();
    const at::Tensor visible = mask.contiguous();
    const float* cp = cosRows.data_ptr<float>();
    const float* sp = sinRows.data_ptr<float>();
    const int64_t* slot = slotRows.data_ptr<int64_t>();
    const bool* mp = visible.data_ptr<bool>();
    const int64_t maskWidth = visible.size(3);
    for (int64_t m = 0; m < rows; ++m) {
        TORCH_CHECK(slot[m] >= 0 && slot[m] < width, "llama_decoder: a slot outside the forward's width");
    }
    for (const int64_t layer : featureLayers) {
        TORCH_CHECK(layer >= 0 && layer < layers, "llama_decoder: feature layer ", layer, " out of range");
    }

    at::Tensor x = hidden.reshape({rows, dModel}).clone();  // the residual stream, updated in place
    at::Tensor normed = at::empty({rows, dModel}, x.options());
    at::Tensor attended = at::empty({rows, qWidth}, x.options());
    at::Tensor activated = at::empty({rows, inter}, x.options());
    at::Tensor features = at::empty({rows, static_cast<int64_t>(featureLayers.size()) * dModel}, x.options());
    float* xp = x.data_ptr<float>();
    const float epsilon = static_cast<float>(eps);
    const int vectorLanes = static_cast<int>(lanes);

    for (int64_t layer = 0; layer < layers; ++layer) {
        const at::Tensor* w = &weights[layer * kTensorsPerLayer];
        const int64_t* b = bits.data() + layer * 4;
        const Weight qkvProj{w + 1, w + 2, w + 3, b[0], qkvWidth}, oProj{w + 4, w + 5, w + 6, b[1], dModel};
        const Weight gateUp{w + 8, w + 9, w + 10, b[2], 2 * inter}, down{w + 11, w + 12, w + 13, b[3], dModel};
        TORCH_CHECK(w[0].numel() == dModel && w[7].numel() == dModel && w[0].scalar_type() == at::kFloat
                    && w[7].scalar_type() == at::kFloat, "llama_decoder: norm weights [D] float32");

        // Attention block.
        rmsNorm(xp, w[0].contiguous().data_ptr<float>(), rows, dModel, epsilon, vectorLanes,
                normed.data_ptr<float>());
        at::Tensor qkv = qkvProj(normed);  // [rows, q | k | v]
        float* qkvp = qkv.data_ptr<float>();
        float* kp = keys[layer].data_ptr<float>();
        float* vp = values[layer].data_ptr<float>();
        const int64_t rowStride = keys[layer].stride(0), headStride = keys[layer].stride(1);
        for (int64_t m = 0; m < rows; ++m) {
            float* row = qkvp + m * qkvWidth;
            for (int64_t h = 0; h < heads + kvHeads; ++h) rope(row + h * headDim, cp + m * headDim, sp + m * headDim, headDim);
            const int64_t bRow = m / length;
            for (int64_t h = 0; h < kvHeads; ++h) {
                const int64_t at = bRow * rowStride + h * headStride + slot[m] * headDim;
                std::memcpy(kp + at, row + qWidth + h * headDim, headDim * sizeof(float));
                std::memcpy(vp + at, row + qWidth + kvWidth + h * headDim, headDim * sizeof(float));
            }
        }
        float* ap = attended.data_ptr<float>();
        const int64_t groups = heads / kvHeads;
        at::parallel_for(0, rows * heads, 8, [&](int64_t begin, int64_t end) {
            std::vector<float> scores(width + 16);
            for (int64_t item = begin; item < end; ++item) {
                const int64_t m = item / heads, h = item % heads, bRow = m / length, t = m % length;
                const int64_t base = bRow * rowStride + (h / groups) * headStride;
                dflash_cpu::attendRow(qkvp + m * qkvWidth + h * headDim, kp + base, headDim, vp + base, headDim,
                                      mp + (bRow * length + t) * maskWidth, width, headDim,
                                      static_cast<float>(scale), scores.data(), ap + m * qWidth + h * headDim);
            }
        });
        const at::Tensor projected = oProj(attended);
        const float* pp = projected.data_ptr<float>();
        for (int64_t i = 0; i < rows * dModel; ++i) xp[i] = xp[i] + pp[i];

        // MLP block.
        rmsNorm(xp, w[7].contiguous().data_ptr<float>(), rows, dModel, epsilon, vectorLanes,
                normed.data_ptr<float>());
        const at::Tensor gu = gateUp(normed);  // [rows, gate | up]
        const float* gp = gu.data_ptr<float>();
        float* actp = activated.data_ptr<float>();
        for (int64_t m = 0; m < rows; ++m) siluMul(gp + m * 2 * inter, gp + m * 2 * inter + inter, inter, actp + m * inter);
        const at::Tensor mlp = down(activated);
        const float* dp = mlp.data_ptr<float>();
        for (int64_t i = 0; i < rows * dModel; ++i) xp[i] = xp[i] + dp[i];

        for (size_t f = 0; f < featureLayers.size(); ++f) {
            if (featureLayers[f] != layer) continue;
            float* fp = features.data_ptr<float>();
            const int64_t featureWidth = features.size(1);
            for (int64_t m = 0; m < rows; ++m) std::memcpy(fp + m * featureWidth + f * dModel, xp + m * dModel,
                                                           dModel * sizeof(float));
        }
    }
    return {x.reshape({batch, length, dModel}), features.reshape({batch, length, -1})};
}

// The parts on their own, for tests: LlamaRMSNorm and silu(gate) * up.
at::Tensor rmsNormOp(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t lanes) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && weight.numel() == x.size(-1)
                && lanes >= 1 && lanes <= kMaxLanes && x.size(-1) >= lanes, "rms_norm: float32 x [..., n >= lanes]");
    const at::Tensor rowsIn = x.contiguous();
    at::Tensor out = at::empty_like(rowsIn);
    const int64_t n = x.size(-1);
    rmsNorm(rowsIn.data_ptr<float>(), weight.contiguous().data_ptr<float>(), rowsIn.numel() / n, n,
            static_cast<float>(eps), static_cast<int>(lanes), out.data_ptr<float>());
    return out;
}

at::Tensor siluMulOp(const at::Tensor& gate, const at::Tensor& up) {
    TORCH_CHECK(gate.scalar_type() == at::kFloat && up.sizes() == gate.sizes() && up.scalar_type() == at::kFloat,
                "silu_mul: float32 gate and up of one shape");
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor out = at::empty_like(g);
    const int64_t n = g.size(-1);
    for (int64_t m = 0; m < g.numel() / n; ++m) {
        siluMul(g.data_ptr<float>() + m * n, u.data_ptr<float>() + m * n, n, out.data_ptr<float>() + m * n);
    }
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dflash_cpu, m) {
    // keys and values: the cache's buffers, written at `slots` (the new tokens' keys and values).
    m.def("llama_decoder(Tensor hidden, Tensor[] weights, int[] bits, Tensor cos, Tensor sin, Tensor(a!)[] keys, "
          "Tensor(b!)[] values, Tensor slots, Tensor mask, int width, int[] dims, float eps, float scale, int lanes, "
          "int[] feature_layers) -> (Tensor, Tensor)");
    m.def("rms_norm(Tensor x, Tensor weight, float eps, int lanes) -> Tensor");
    m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
}

TORCH_LIBRARY_IMPL(dflash_cpu, CPU, m) {
    m.impl("llama_decoder", llamaDecoder);
    m.impl("rms_norm", rmsNormOp);
    m.impl("silu_mul", siluMulOp);
}
