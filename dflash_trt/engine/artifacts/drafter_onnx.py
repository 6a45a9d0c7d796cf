"""The onnx and tensorrt runtimes' drafter: an ONNX graph with the DFlashAttention plugin node, and the
TensorRT engine compiled from it with the project's plugin library.

The exporter belongs to the plugin package: `dflash_trt.plugin.export.export_drafter_onnx(drafter_dir,
out_path)`. Until it exists the step fails with one line and the rest of the engine is still built.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ...errors import DFlashError
from ..needs import StepUnavailable, trtexec_path

ONNX_NAME = "drafter.onnx"
PLAN_NAME = "drafter.plan"
TRT_PLUGIN_TARGET = "dflash_attention_trt"


def export_onnx(drafter_dir: Path, out: Path) -> Path:
    try:
        from ...plugin.export import export_drafter_onnx
    except ImportError:
        raise StepUnavailable("drafter-onnx", "the drafter ONNX exporter (dflash_trt.plugin.export), which is not "
                              "yet available in this version", "build with --runtime torch meanwhile") from None
    export_drafter_onnx(drafter_dir, out)
    if not out.is_file():
        raise DFlashError(f"the ONNX exporter did not write {out}")
    return out


def plugin_library() -> Path:
    from ...plugin import build

    return build.library_path(getattr(build, "TRT_TARGET", TRT_PLUGIN_TARGET))


def trtexec_command(onnx: Path, plan: Path, library: Path) -> list[str]:
    # TensorRT 10+/11 networks are strongly typed: precisions come from the ONNX graph, not builder flags.
    return ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}", "--stronglyTyped", f"--dynamicPlugins={library}"]


def build_plan(onnx: Path, plan: Path) -> Path:
    """Compile the drafter ONNX into a TensorRT engine with trtexec and the plugin library."""
    if trtexec_path() is None:
        raise StepUnavailable("tensorrt-build", "TensorRT (trtexec) and a CUDA GPU")
    library = plugin_library()
    if not library.is_file():
        raise StepUnavailable("tensorrt-build", f"the TensorRT plugin library {library} (`make plugins` builds it "
                              "where TensorRT headers are found)")
    proc = subprocess.run(trtexec_command(onnx, plan, library), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " ".join(proc.stdout.splitlines()[-3:] + proc.stderr.splitlines()[-3:])
        raise DFlashError(f"trtexec failed to build {plan.name}: {tail[-400:]}")
    return plan
