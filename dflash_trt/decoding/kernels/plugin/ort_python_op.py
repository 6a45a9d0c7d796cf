"""Fallback custom op for the `onnx` runtime where the C++ onnxruntime library cannot be built.

onnxruntime's PyPI wheel ships no C headers, so libdflash_attention_ort.so is built only where
onnxruntime_c_api.h is provided. Elsewhere the same node runs through onnxruntime-extensions' Python custom
ops, whose body is the C++ CPU twin (ctypes). Python custom ops live in the "ai.onnx.contrib" domain, so the
session gets a copy of the model with the plugin nodes moved there; fp32 only.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from dflash_trt.decoding.kernels.plugin.fields import FIELD_NAMES, fields_from_list
from dflash_trt.decoding.kernels.plugin.onnx_node import INT_FIELDS, ONNX_DOMAIN, OP_TYPE

PYTHON_OP_DOMAIN = "ai.onnx.contrib"


def available() -> bool:
    try:
        import onnxruntime_extensions  # noqa: F401
    except ImportError:
        return False
    return True


def _attention(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, **attrs):
    from dflash_trt.decoding.kernels.plugin.library import cpu_draft_attention

    fields = fields_from_list([float(attrs[name]) for name in FIELD_NAMES])
    new_k, new_v = torch.from_numpy(np.array(cache_k)), torch.from_numpy(np.array(cache_v))
    out = cpu_draft_attention(fields, *(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v, ctx_k, ctx_v)),
                              new_k, new_v, torch.from_numpy(cache_lens), torch.from_numpy(ctx_lens))
    return out.numpy(), new_k.numpy(), new_v.numpy()


@functools.lru_cache(maxsize=None)
def library_path() -> str:
    """Register the Python op (once) and return the onnxruntime-extensions library to load into a session."""
    from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op

    attrs = {name: PyCustomOpDef.dt_int64 if name in INT_FIELDS else PyCustomOpDef.dt_float for name in FIELD_NAMES}
    onnx_op(op_type=OP_TYPE, inputs=[PyCustomOpDef.dt_float] * 7 + [PyCustomOpDef.dt_int32] * 2,
            outputs=[PyCustomOpDef.dt_float] * 3, attrs=attrs)(_attention)
    return get_library_path()


def retarget_model(model_path) -> bytes:
    """The model with its plugin nodes in the Python custom-op domain (serialised, for a session)."""
    import onnx

    model = onnx.load(str(model_path))
    for node in model.graph.node:
        if node.domain == ONNX_DOMAIN and node.op_type == OP_TYPE:
            node.domain = PYTHON_OP_DOMAIN
    for opset in model.opset_import:
        if opset.domain == ONNX_DOMAIN:
            opset.domain = PYTHON_OP_DOMAIN
    return model.SerializeToString()
