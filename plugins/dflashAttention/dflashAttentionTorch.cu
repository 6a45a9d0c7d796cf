/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The CUDA kernels as a PyTorch operator, dflash_cuda::draft_attention_ (built at first use on a CUDA machine by
 * dflash_trt.decoding.kernels.plugin.cuda_op): the caches are updated in place, the kernels run on the current stream, the workspace
 * comes from PyTorch's caching allocator, and nothing synchronises with the host, so calls can be captured in a CUDA
 * graph (after one call outside the capture, which sets the kernels' shared-memory limit).
 */
#include "dflashAttentionKernel.h"
#include "dflashAttentionPlan.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

namespace
{

using namespace dflash;

constexpr int32_t kNB_FIELDS{13};

DflashAttentionFields fieldsFromList(c10::ArrayRef<double> values)
{
    TORCH_CHECK(values.size() == kNB_FIELDS, "DFlashAttention: expected ", kNB_FIELDS, " fields, got ", values.size());
    auto i32 = [&](int32_t i) { return static_cast<int32_t>(values[i]); };
    auto f32 = [&](int32_t i) { return static_cast<float>(values[i]); };
    // Order of dflash::DflashAttentionFields (and of dflash_trt.decoding.kernels.plugin.fields.FIELD_NAMES).
    return DflashAttentionFields{i32(0), i32(1), i32(2), i32(3), f32(4), f32(5), i32(6), f32(7), f32(8), f32(9), f32(10),
        f32(11), i32(12)};
}

dflash::DataType kernelType(at::ScalarType type)
{
    switch (type)
    {
    case at::kFloat: return dflash::DataType::kFLOAT;
    case at::kHalf: return dflash::DataType::kHALF;
    case at::kBFloat16: return dflash::DataType::kBF16;
    default: TORCH_CHECK(false, "DFlashAttention: unsupported dtype ", type, " (float32, float16 or bfloat16)");
    }
}

bool aligned16(at::Tensor const& t)
{
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

//! Contiguous and 16-byte aligned (the tensor-core kernel copies 16 bytes at a time); copies only when needed.
at::Tensor prepared(at::Tensor const& t)
{
    at::Tensor c = t.contiguous();
    return aligned16(c) ? c : c.clone();
}

at::Tensor draftAttentionInplace(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& ctxK,
    at::Tensor const& ctxV, at::Tensor& cacheK, at::Tensor& cacheV, at::Tensor const& cacheLens,
    at::Tensor const& ctxLens, c10::ArrayRef<double> fieldValues)
{
    DflashAttentionFields const fields = fieldsFromList(fieldValues);
    std::string const fieldError = validateFields(fields);
    TORCH_CHECK(fieldError.empty(), fieldError);
    at::Tensor const* inputs[9] = {&q, &k, &v, &ctxK, &ctxV, &cacheK, &cacheV, &cacheLens, &ctxLens};
    InputDims dims{};
    for (int32_t i = 0; i < 9; ++i)
    {
        at::Tensor const& t = *inputs[i];
        TORCH_CHECK(t.is_cuda() && t.device() == q.device(), "DFlashAttention: every input must be on ", q.device());
        TORCH_CHECK(t.dim() <= 4, "DFlashAttention: input ", i, " has ", t.dim(), " dims");
        dims.nbDims[i] = static_cast<int32_t>(t.dim());
        for (int32_t a = 0; a < t.dim(); ++a)
        {
            dims.d[i][a] = t.size(a);
        }
        TORCH_CHECK(i >= 7 || t.scalar_type() == q.scalar_type(), "DFlashAttention: input ", i, " is ",
            t.scalar_type(), ", q is ", q.scalar_type());
    }
    std::string const shapeError = checkInputDims(fields, dims);
    TORCH_CHECK(shapeError.empty(), shapeError);
    TORCH_CHECK(cacheK.is_contiguous() && cacheV.is_contiguous() && aligned16(cacheK) && aligned16(cacheV),
        "DFlashAttention: cache_k and cache_v must be contiguous and 16-byte aligned: they are updated in place");
    TORCH_CHECK(q.size(0) > 0 && q.size(1) > 0, "DFlashAttention: empty batch or block");

    c10::cuda::CUDAGuard const guard(q.device());
    at::Tensor const qc = prepared(q);
    at::Tensor const kc = prepared(k);
    at::Tensor const vc = prepared(v);
    at::Tensor const ctxKc = prepared(ctxK);
    at::Tensor const ctxVc = prepared(ctxV);
    at::Tensor const lens = cacheLens.to(at::kInt).contiguous();
    at::Tensor const added = ctxLens.to(at::kInt).contiguous();
    at::Tensor out = at::empty_like(qc);

    dflash::DataType const type = kernelType(q.scalar_type());
    DflashAttentionParams p = makeParams(fields);
    p.q = qc.data_ptr();
    p.k = kc.data_ptr();
    p.v = vc.data_ptr();
    p.ctxK = ctxKc.data_ptr();
    p.ctxV = ctxVc.data_ptr();
    p.cacheK = cacheK.data_ptr();
    p.cacheV = cacheV.data_ptr();
    p.cacheLens = lens.data_ptr<int32_t>();
    p.ctxLens = added.data_ptr<int32_t>();
    p.out = out.data_ptr();
    p.batch = static_cast<int32_t>(q.size(0));
    p.blockLen = static_cast<int32_t>(q.size(1));
    p.ctxRows = static_cast<int32_t>(ctxK.size(1));
    p.cacheCapacity = static_cast<int32_t>(cacheK.size(2));
    size_t const workspaceBytes = dflashAttentionWorkspaceSize(
        p.batch, p.blockLen, p.numHeads, p.numKvHeads, p.headDim, p.cacheCapacity, type);
    at::Tensor workspace = at::empty({static_cast<int64_t>(workspaceBytes)}, q.options().dtype(at::kByte));
    cudaError_t const status = launchDflashAttention(
        p, type, workspace.data_ptr(), workspaceBytes, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(status == cudaSuccess, "DFlashAttention: kernel launch failed: ", cudaGetErrorString(status));
    return out;
}

} // namespace

TORCH_LIBRARY(dflash_cuda, m)
{
    m.def(
        "draft_attention_(Tensor q, Tensor k, Tensor v, Tensor ctx_k, Tensor ctx_v, Tensor(a!) cache_k, "
        "Tensor(b!) cache_v, Tensor cache_lens, Tensor ctx_lens, float[] fields) -> Tensor");
}

TORCH_LIBRARY_IMPL(dflash_cuda, CUDA, m)
{
    m.impl("draft_attention_", &draftAttentionInplace);
}
