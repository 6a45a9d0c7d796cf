"""The drafter exports to ONNX with one DFlashAttention plugin node per layer, and the graph checks."""

from __future__ import annotations

import pytest

from dflash_trt.decoding.kernels.plugin.fields import ROPE_YARN
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

onnx = pytest.importorskip("onnx")

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
        "beta_slow": 1.0}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from dflash_trt.decoding.model.exported.export import export_drafter_onnx

    target = make_tiny_target("qwen3", hidden_size=256)  # head_dim 64, a size the plugin supports
    drafter_dir = tmp_path_factory.mktemp("drafter")
    drafter = make_tiny_drafter(target.config, drafter_dir, num_layers=3, rope_scaling=YARN)
    path = export_drafter_onnx(drafter_dir, tmp_path_factory.mktemp("onnx") / "drafter.onnx")
    return drafter, onnx.load(str(path))


def plugin_nodes(model):
    return [n for n in model.graph.node if n.op_type == "DFlashAttention"]


def test_exported_graph_passes_onnx_checker(exported):
    onnx.checker.check_model(exported[1], full_check=True)


def test_one_plugin_node_per_layer_in_the_custom_domain(exported):
    drafter, model = exported
    nodes = plugin_nodes(model)
    assert len(nodes) == drafter.config.num_hidden_layers
    assert {n.domain for n in nodes} == {"dflash"}
    assert ("dflash", 1) in {(o.domain, o.version) for o in model.opset_import}


def test_plugin_node_carries_fields_version_and_namespace(exported):
    drafter, model = exported
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in plugin_nodes(model)[0].attribute}
    assert attrs["plugin_version"] == b"1" and attrs["plugin_namespace"] == b""
    assert (attrs["num_heads"], attrs["num_kv_heads"], attrs["head_dim"]) == (4, 2, 64)
    assert attrs["rope_type"] == ROPE_YARN and attrs["yarn_factor"] == 4.0
    assert attrs["yarn_original_max_position_embeddings"] == 256
    assert attrs["rope_theta"] == drafter.config.rope_theta


def test_graph_io_names_the_caches_and_keeps_batch_and_context_dynamic(exported):
    drafter, model = exported
    inputs = {i.name: i for i in model.graph.input}
    layers = drafter.config.num_hidden_layers
    assert list(inputs)[:4] == ["block_embeds", "features", "cache_lens", "ctx_lens"]
    assert len(inputs) == 4 + 2 * layers and len(model.graph.output) == 1 + 2 * layers
    cache_dims = inputs["cache_k_0"].type.tensor_type.shape.dim
    assert cache_dims[0].dim_param and cache_dims[2].dim_param  # batch and capacity are symbolic
    assert inputs["features"].type.tensor_type.shape.dim[1].dim_param


@pytest.mark.slow
def test_bf16_preset_exports_a_bf16_graph_for_tensorrt(tmp_path):
    # A bf16 engine's TensorRT drafter must not silently run in fp32 (--stronglyTyped takes the graph's types).
    from dflash_trt.engine.artifacts.drafter_onnx import export_onnx

    target = make_tiny_target("qwen3", hidden_size=256)
    drafter_dir = tmp_path / "drafter"
    make_tiny_drafter(target.config, drafter_dir, num_layers=1)
    model = onnx.load(str(export_onnx(drafter_dir, tmp_path / "drafter.onnx", "bfloat16", "tensorrt")))
    bf16 = onnx.TensorProto.BFLOAT16
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert inputs["block_embeds"] == bf16 and inputs["cache_k_0"] == bf16
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {bf16}


def test_sliding_drafters_are_refused_in_one_line():
    import pytest as _pytest

    from dflash_trt.decoding.model.exported.export import export_drafter
    from dflash_trt.errors import ConfigError
    from dflash_trt.testing import make_tiny_drafter, tiny_target_config

    drafter = make_tiny_drafter(tiny_target_config("llama"), sliding_window=6)
    with _pytest.raises(ConfigError, match="sliding-window") as info:
        export_drafter(drafter, "unused.onnx")
    assert "--runtime torch" in str(info.value)
