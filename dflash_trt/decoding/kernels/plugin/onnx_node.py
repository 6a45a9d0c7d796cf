"""The DFlashAttention ONNX node: a custom-domain node whose op_type is the TensorRT plugin's name.

TensorRT's ONNX parser maps it to the plugin through op_type + plugin_version / plugin_namespace; onnxruntime
runs it with the custom-op library built from the same C++ sources (libdflash_attention_ort.so).
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.decoding.kernels.plugin.build import ORT_TARGET, build_plugins, configured_targets, library_path
from dflash_trt.decoding.kernels.plugin.fields import INT_FIELDS, AttentionFields  # noqa: F401 (onnx_node.INT_FIELDS)

OP_TYPE = "DFlashAttention"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
ONNX_DOMAIN = "dflash"
DOMAIN_VERSION = 1
INPUT_NAMES = ("q", "k", "v", "ctx_k", "ctx_v", "cache_k", "cache_v", "cache_lens", "ctx_lens")
OUTPUT_NAMES = ("out", "cache_k_out", "cache_v_out")


def node_attributes(fields: AttentionFields) -> dict[str, int | float | str]:
    """ONNX attributes of the node: every plugin field plus the plugin's version and namespace."""
    attrs: dict[str, int | float | str] = {
        name: int(value) if name in INT_FIELDS else float(value) for name, value in fields.attributes().items()}
    attrs["plugin_version"] = PLUGIN_VERSION
    attrs["plugin_namespace"] = PLUGIN_NAMESPACE
    return attrs


def make_node(fields: AttentionFields, inputs: list[str], outputs: list[str], name: str = "dflash_attention"):
    """onnx.NodeProto of one DFlashAttention call (inputs/outputs in the order of INPUT_NAMES/OUTPUT_NAMES)."""
    import onnx

    return onnx.helper.make_node(OP_TYPE, inputs, outputs, name=name, domain=ONNX_DOMAIN, **node_attributes(fields))


def ort_library(build: bool = True) -> Path | None:
    """Path of the onnxruntime custom-op library, or None where it cannot be built (no onnxruntime C header)."""
    path = library_path(ORT_TARGET)
    if build and (Path(__file__).resolve().parents[4] / "plugins" / "CMakeLists.txt").exists():
        build_dir = build_plugins(("dflash_attention_cpu",))
        if f"{ORT_TARGET}" not in configured_targets(build_dir).split("skipped")[0]:
            return None
        build_plugins((ORT_TARGET,))
    return path if path.exists() else None
