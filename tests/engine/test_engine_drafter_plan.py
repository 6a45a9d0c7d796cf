"""The tensorrt runtime's drafter build: export dtype per runtime, and a trtexec command that aliases the caches."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.engine.artifacts.drafter_onnx import ALIASED_PLUGIN_IO, export_dtype, trtexec_command


def test_tensorrt_keeps_the_engine_dtype_and_onnxruntime_gets_a_numpy_dtype():
    assert export_dtype("bfloat16", "tensorrt") == "bfloat16"
    assert export_dtype("float16", "tensorrt") == "float16"
    assert export_dtype("bfloat16", "onnx") == "float32"  # onnxruntime's CPU op and numpy have no bfloat16
    assert export_dtype("float16", "onnx") == "float16"
    assert export_dtype("float32", "tensorrt") == "float32"


def test_trtexec_enables_aliased_plugin_io_so_caches_update_in_place():
    command = trtexec_command(Path("d.onnx"), Path("d.plan"), Path("lib.so"), {"min": ["x:1"], "opt": ["x:2"],
                                                                              "max": ["x:4"]})
    # trtexec spells TensorRT's PreviewFeature::kALIASED_PLUGIN_IO_10_03 as --preview=+aliasedPluginIO1003.
    assert ALIASED_PLUGIN_IO == "--preview=+aliasedPluginIO1003" and ALIASED_PLUGIN_IO in command
    assert "--stronglyTyped" in command and "--dynamicPlugins=lib.so" in command
    assert "--minShapes=x:1" in command and "--maxShapes=x:4" in command
