"""onnxruntime runs a DFlashAttention node with the C++ custom-op library (skipped where it cannot be built)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plugin_cases import Case, clone_inputs, make_inputs

from dflash_trt.decoding.kernels.plugin.library import cpu_draft_attention
from dflash_trt.decoding.kernels.plugin.onnx_node import (DOMAIN_VERSION, INPUT_NAMES, ONNX_DOMAIN, OUTPUT_NAMES,
                                                          make_node, ort_library)

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ONNX_TYPES = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
              torch.bfloat16: onnx.TensorProto.BFLOAT16}


@pytest.fixture(scope="module")
def library():
    path = ort_library()
    if path is None:
        pytest.skip("onnxruntime custom-op library not built (onnxruntime_c_api.h not found; set ONNXRUNTIME_ROOT)")
    return path


def single_node_model(case: Case, dtype: torch.dtype) -> bytes:
    value_type = ONNX_TYPES[dtype]
    shapes = {"q": [case.batch, case.block, case.heads, case.head_dim],
              "k": [case.batch, case.block, case.kv_heads, case.head_dim],
              "ctx_k": [case.batch, case.ctx_rows, case.kv_heads, case.head_dim],
              "cache_k": [case.batch, case.kv_heads, case.capacity, case.head_dim]}
    shapes.update(v=shapes["k"], ctx_v=shapes["ctx_k"], cache_v=shapes["cache_k"])
    inputs = [onnx.helper.make_tensor_value_info(n, value_type, shapes[n]) for n in INPUT_NAMES[:7]]
    inputs += [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT32, [case.batch]) for n in INPUT_NAMES[7:]]
    outputs = [onnx.helper.make_tensor_value_info(n, value_type, shapes[like])
               for n, like in zip(OUTPUT_NAMES, ("q", "cache_k", "cache_v"))]
    graph = onnx.helper.make_graph([make_node(case.fields, list(INPUT_NAMES), list(OUTPUT_NAMES))], "attn",
                                   inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid(ONNX_DOMAIN, DOMAIN_VERSION)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def session(model: bytes, library) -> "ort.InferenceSession":
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        raise TypeError("bf16 is fed through OrtValue")
    return t.numpy() if t.dtype != torch.int64 else t.to(torch.int32).numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_onnxruntime_node_equals_cpu_twin(library, dtype):
    case = Case(2, 8, 8, 2, 64, 5, 300, (250, 3), (5, 2), 150000.0, True)
    inputs = make_inputs(case, dtype, seed=1)
    expected_in = clone_inputs(inputs)
    expected = cpu_draft_attention(case.fields, **expected_in)
    out, cache_k, cache_v = session(single_node_model(case, dtype), library).run(
        None, {name: to_numpy(inputs[name]) for name in INPUT_NAMES})
    assert np.array_equal(out, expected.numpy())
    assert np.array_equal(cache_k, expected_in["cache_k"].numpy())
    assert np.array_equal(cache_v, expected_in["cache_v"].numpy())
    assert np.array_equal(to_numpy(inputs["cache_k"]), inputs["cache_k"].numpy())  # feeds are not modified


def test_onnxruntime_rejects_bad_attributes_with_the_plugin_message(library):
    case = Case(1, 4, 6, 4, 64, 1, 8, (0,), (1,), 10000.0, False)  # 4 KV heads do not divide 6 heads
    with pytest.raises(Exception, match="num_kv_heads"):
        session(single_node_model(case, torch.float32), library)
