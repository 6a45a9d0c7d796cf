"""The onnx and tensorrt runtimes' drafter: an ONNX graph with the DFlashAttention plugin node, and the
TensorRT engine compiled from it with the project's plugin library.

The exporter belongs to the plugin package: `dflash_trt.decoding.model.exported.export.export_drafter_onnx(drafter_dir,
out_path)`. Until it exists the step fails with one line and the rest of the engine is still built.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.needs import StepUnavailable, trtexec_path
from dflash_trt.errors import DFlashError

ONNX_NAME = "drafter.onnx"
PLAN_NAME = "drafter.plan"
TRT_PLUGIN_TARGET = "dflash_attention_trt"


# trtexec's switch for TensorRT's PreviewFeature::kALIASED_PLUGIN_IO_10_03: without it the plugin's cache outputs are
# not aliased to its cache inputs and every call copies both caches at full capacity.
ALIASED_PLUGIN_IO = "--preview=+aliasedPluginIO1003"


def export_dtype(dtype: str, runtime: str = "onnx") -> str:
    """Value dtype of the exported graph: the engine's own for TensorRT (bf16 presets stay bf16); for onnxruntime
    float16 or float32 (onnxruntime's CPU op and numpy have no bfloat16)."""
    if runtime == "tensorrt" and dtype in ("bfloat16", "float16"):
        return dtype
    return "float16" if dtype == "float16" else "float32"


def export_onnx(drafter_dir: Path, out: Path, dtype: str = "float32", runtime: str = "onnx") -> Path:
    """Export the drafter in export_dtype(dtype, runtime)."""
    import torch

    try:
        from dflash_trt.decoding.model.exported.export import export_drafter_onnx
    except ImportError:
        raise StepUnavailable("drafter-onnx", "the drafter ONNX exporter (dflash_trt.decoding.model.exported.export), which is not "
                              "yet available in this version", "build with --runtime torch meanwhile") from None
    export_drafter_onnx(drafter_dir, out, dtype=getattr(torch, export_dtype(dtype, runtime)))
    if not out.is_file():
        raise DFlashError(f"the ONNX exporter did not write {out}")
    return out


def plugin_library() -> Path:
    from dflash_trt.decoding.kernels.plugin import build

    return build.library_path(getattr(build, "TRT_TARGET", TRT_PLUGIN_TARGET))


def shape_profile(config: DrafterConfig, max_batch_size: int, max_seq_len: int) -> dict[str, list[str]]:
    """trtexec min/opt/max shapes of the exported graph's inputs (names and layout of plugin.export).

    Dynamic: batch B, new context rows C (1 after a verify step, up to a whole prompt at prefill), the
    cache capacity Cmax (the runtime allocates max_seq_len rows) and the block S (2 up to the trained block:
    the last block of a generation shrinks to the tokens that remain).
    """
    s, d, k = config.block_size, config.hidden_size, config.num_target_features
    hkv, dh = config.num_key_value_heads, config.head_dim
    sizes = {"min": (1, 1, 1, min(2, s)), "opt": (min(8, max_batch_size), s, max_seq_len, s),
             "max": (max_batch_size, max_seq_len, max_seq_len, s)}
    profile = {}
    for name, (b, c, cmax, block) in sizes.items():
        shapes = [f"block_embeds:{b}x{block}x{d}", f"features:{b}x{c}x{k * d}", f"cache_lens:{b}",
                  f"ctx_lens:{b}"]
        shapes += [f"cache_{kv}_{i}:{b}x{hkv}x{cmax}x{dh}" for i in range(config.num_hidden_layers) for kv in "kv"]
        profile[name] = shapes
    return profile


def trtexec_command(onnx: Path, plan: Path, library: Path, profile: dict[str, list[str]]) -> list[str]:
    # TensorRT 10+/11 networks are strongly typed: precisions come from the ONNX graph, not builder flags.
    return ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}", "--stronglyTyped", f"--dynamicPlugins={library}",
            ALIASED_PLUGIN_IO, *(f"--{name}Shapes={','.join(shapes)}" for name, shapes in profile.items())]


def build_plan(onnx: Path, plan: Path, config: DrafterConfig, max_batch_size: int, max_seq_len: int) -> Path:
    """Compile the drafter ONNX into a TensorRT engine with trtexec and the plugin library."""
    if trtexec_path() is None:
        raise StepUnavailable("tensorrt-build", "TensorRT (trtexec) and a CUDA GPU")
    library = plugin_library()
    if not library.is_file():
        raise StepUnavailable("tensorrt-build", f"the TensorRT plugin library {library} (`make plugins` builds it "
                              "where TensorRT headers are found)")
    command = trtexec_command(onnx, plan, library, shape_profile(config, max_batch_size, max_seq_len))
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " ".join(proc.stdout.splitlines()[-3:] + proc.stderr.splitlines()[-3:])
        raise DFlashError(f"trtexec failed to build {plan.name}: {tail[-400:]}")
    return plan
