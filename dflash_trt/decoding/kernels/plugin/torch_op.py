"""The plugin as torch custom ops.

`torch.ops.dflash.draft_attention` is functional: it returns the updated caches instead of writing them in place, as
the ONNX node does; its fake implementation gives shapes for torch.export, and `onnx_translation` turns each call
into one DFlashAttention node of the custom ONNX domain.
`torch.ops.dflash.draft_attention_` updates cache_k/cache_v in place and returns out (what the drafter runs).
Both run the C++ CPU twin on CPU tensors and the CUDA kernels on CUDA tensors (cuda_op.py builds them at first use);
on CUDA they use the current stream and never synchronise with the host, so calls can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.kernels.plugin.fields import FIELD_NAMES, fields_from_list
from dflash_trt.decoding.kernels.plugin.onnx_node import (DOMAIN_VERSION, INPUT_NAMES, INT_FIELDS, ONNX_DOMAIN, OP_TYPE,
                                                          OUTPUT_NAMES, node_attributes)


@torch.library.custom_op("dflash::draft_attention", mutates_args=())
def draft_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                       cache_k: torch.Tensor, cache_v: torch.Tensor, cache_lens: torch.Tensor, ctx_lens: torch.Tensor,
                       fields: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from dflash_trt.decoding.kernels.plugin.library import cpu_draft_attention

    new_k, new_v = cache_k.contiguous().clone(), cache_v.contiguous().clone()
    out = cpu_draft_attention(fields_from_list(fields), q, k, v, ctx_k, ctx_v, new_k, new_v, cache_lens, ctx_lens)
    return out, new_k, new_v


@draft_attention_op.register_fake
def _(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, fields):
    return torch.empty_like(q), torch.empty_like(cache_k), torch.empty_like(cache_v)


def _cuda_kernel():
    from dflash_trt.decoding.kernels.plugin.cuda_op import load_cuda_op

    return load_cuda_op()


@torch.library.custom_op("dflash::draft_attention_", mutates_args=("cache_k", "cache_v"))
def draft_attention_inplace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_k: torch.Tensor,
                            ctx_v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                            cache_lens: torch.Tensor, ctx_lens: torch.Tensor, fields: list[float]) -> torch.Tensor:
    """The op with the caches updated in place (CPU: the C++ CPU twin)."""
    from dflash_trt.decoding.kernels.plugin.library import cpu_draft_attention

    return cpu_draft_attention(fields_from_list(fields), q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens)


@draft_attention_inplace.register_kernel("cuda")
def _(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, fields):
    return _cuda_kernel()(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, list(fields))


@draft_attention_inplace.register_fake
def _(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, fields):
    return torch.empty_like(q)


@draft_attention_op.register_kernel("cuda")
def _(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, fields):
    new_k, new_v = cache_k.contiguous().clone(), cache_v.contiguous().clone()
    out = _cuda_kernel()(q, k, v, ctx_k, ctx_v, new_k, new_v, cache_lens, ctx_lens, list(fields))
    return out, new_k, new_v


def _schema():
    import onnx

    param, attr = onnx.defs.OpSchema.FormalParameter, onnx.defs.OpSchema.Attribute
    kinds = onnx.defs.OpSchema.AttrType
    inputs = [param(name, "I" if name.endswith("lens") else "T") for name in INPUT_NAMES]
    outputs = [param(name, "T") for name in OUTPUT_NAMES]
    attributes = [attr(name, kinds.INT if name in INT_FIELDS else kinds.FLOAT, "") for name in FIELD_NAMES]
    attributes += [attr("plugin_version", kinds.STRING, ""), attr("plugin_namespace", kinds.STRING, "")]
    types = [("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "value type"),
             ("I", ["tensor(int32)"], "lengths")]
    return onnx.defs.OpSchema(OP_TYPE, ONNX_DOMAIN, DOMAIN_VERSION, inputs=inputs, outputs=outputs,
                              type_constraints=types, attributes=attributes)


def onnx_translation(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, fields):
    """custom_translation_table entry of torch.onnx.export (dynamo): one DFlashAttention node."""
    from onnxscript.values import Op, Opset

    op = Op(Opset(ONNX_DOMAIN, DOMAIN_VERSION), OP_TYPE, _schema())
    return op(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens,
              **node_attributes(fields_from_list(list(fields))))
