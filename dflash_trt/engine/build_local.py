"""Runtime steps of the torch, onnx and tensorrt runtimes (the target runs in PyTorch for all three)."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.engine import steps
from dflash_trt.engine.artifacts import checkpoints, drafter_onnx
from dflash_trt.engine.needs import StepUnavailable
from dflash_trt.engine.presets import Preset
from dflash_trt.engine.quantize import QUANT_STATE_NAME, quantize_target
from dflash_trt.engine.steps import run_step, unavailable


def build_local(preset: Preset, pair, engine_dir: Path, progress: steps.Progress,
                pending: steps.Pending) -> dict[str, str]:
    log = progress.log
    target_dir, drafter_dir = engine_dir / "target", engine_dir / "drafter"
    target_fp = {"source": steps.file_fingerprint(pair.target.path), "dtype": preset.dtype}

    progress.step(f"prepare the target, quantize ({preset.quant})")
    run_step("target", engine_dir, target_fp, [target_dir],
             lambda: checkpoints.place_target(pair.target, target_dir, preset.dtype, log), log)
    artifacts = {"target": "target", "drafter": "drafter"}
    if preset.quant in ("fp8", "nvfp4"):
        state = engine_dir / QUANT_STATE_NAME
        try:
            run_step("quantize", engine_dir, {"target": target_fp, "quant": preset.quant}, [state],
                     lambda: quantize_target(preset.quant, preset.runtime, target_dir, state, preset.dtype, log), log)
            artifacts["quantization"] = QUANT_STATE_NAME
        except StepUnavailable as exc:
            unavailable(pending, exc, True, log)
    else:
        quantize_target(preset.quant, preset.runtime, target_dir, engine_dir / QUANT_STATE_NAME, preset.dtype, log)
        (engine_dir / QUANT_STATE_NAME).unlink(missing_ok=True)  # left by an earlier quantized build
        steps.clear_stamp(engine_dir, "quantize")

    progress.step(f"write {preset.runtime} artifacts")
    drafter_fp = {"source": steps.file_fingerprint(pair.drafter.path)}
    run_step("drafter", engine_dir, drafter_fp, [drafter_dir],
             lambda: checkpoints.place_drafter(pair.drafter, drafter_dir, log), log)
    if preset.runtime in ("onnx", "tensorrt"):
        artifacts.update(_drafter_graphs(preset, pair.drafter_config, engine_dir, drafter_dir, drafter_fp, pending, log))
    return artifacts


def _drafter_graphs(preset: Preset, config, engine_dir: Path, drafter_dir: Path, drafter_fp: dict,
                    pending: steps.Pending, log) -> dict[str, str]:
    onnx, plan = engine_dir / drafter_onnx.ONNX_NAME, engine_dir / drafter_onnx.PLAN_NAME
    out: dict[str, str] = {}
    try:
        export_dtype = drafter_onnx.export_dtype(preset.dtype, preset.runtime)
        run_step("drafter-onnx", engine_dir, {**drafter_fp, "dtype": export_dtype}, [onnx],
                 lambda: drafter_onnx.export_onnx(drafter_dir, onnx, preset.dtype, preset.runtime), log)
        out["drafter_onnx"] = drafter_onnx.ONNX_NAME
    except StepUnavailable as exc:
        unavailable(pending, exc, True, log)
        if preset.runtime == "tensorrt":
            pending.skipped("tensorrt-build", "drafter-onnx")
        return out
    if preset.runtime == "tensorrt":
        try:
            fingerprint = {"onnx": steps.file_fingerprint(onnx), "batch": preset.max_batch_size,
                           "seq": preset.max_seq_len}
            run_step("tensorrt-build", engine_dir, fingerprint, [plan], lambda: drafter_onnx.build_plan(
                onnx, plan, config, preset.max_batch_size, preset.max_seq_len), log)
            out["tensorrt_plan"] = drafter_onnx.PLAN_NAME
        except StepUnavailable as exc:
            unavailable(pending, exc, True, log)
    return out
