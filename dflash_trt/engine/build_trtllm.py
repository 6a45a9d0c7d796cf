"""Runtime steps of the trtllm runtime: link the checkpoints, write the LLM-API options, check them."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_trt.engine import steps
from dflash_trt.engine.artifacts import trtllm
from dflash_trt.engine.needs import StepUnavailable
from dflash_trt.engine.presets import Preset
from dflash_trt.engine.quantize import quantize_target
from dflash_trt.engine.steps import run_step, unavailable


def build_trtllm(preset: Preset, pair, engine_dir: Path, progress: steps.Progress,
                 pending: steps.Pending) -> dict[str, str]:
    log = progress.log
    progress.step(f"prepare the target, quantize ({preset.quant})")
    links = [("target", pair.target.path), ("drafter", pair.drafter.path)]
    if preset.quant in ("fp8", "nvfp4"):
        # The quantized checkpoint is written into the engine as target/; TensorRT-LLM loads it from there.
        links = links[1:]
        quantized = engine_dir / "target"
        if quantized.is_symlink():
            quantized.unlink()
        fingerprint = {"source": steps.file_fingerprint(pair.target.path / "config.json"), "quant": preset.quant}
        try:
            run_step("quantize", engine_dir, fingerprint, [quantized], lambda: quantize_target(
                preset.quant, preset.runtime, pair.target.path, quantized, preset.dtype, log), log)
        except StepUnavailable as exc:
            unavailable(pending, exc, True, log)
    else:
        quantize_target(preset.quant, preset.runtime, pair.target.path, engine_dir / "target", preset.dtype, log)

    progress.step("write trtllm artifacts")
    for name, path in links:
        link = engine_dir / name
        if link.is_symlink() and link.resolve() == path:
            log(f"  {name}: up to date")
            continue
        if link.is_symlink() or link.exists():
            _remove(link)
        os.symlink(path, link, target_is_directory=True)
        log(f"  linking {link} -> {path}")

    target = (engine_dir / "target").resolve()
    options = trtllm.trtllm_options(preset, pair.arch, pair.drafter_config, pair.drafter.path, target)
    path = engine_dir / trtllm.OPTIONS_NAME
    trtllm.write_options(options, path, str(target), preset.profile)
    log(f"  wrote {path} (TensorRT-LLM {trtllm.TRTLLM_VERSION} fields)")
    if pending.has("quantize"):
        pending.skipped("trtllm-check", "quantize", blocking=False)
        return {"target": "target", "drafter": "drafter", "trtllm_options": trtllm.OPTIONS_NAME}
    try:
        version = trtllm.check_with_trtllm(options, target)
        log(f"  TensorRT-LLM {version} accepts the options")
    except StepUnavailable as exc:
        # The options are complete; only the check against an installed TensorRT-LLM could not run.
        unavailable(pending, exc, False, log)
    return {"target": "target", "drafter": "drafter", "trtllm_options": trtllm.OPTIONS_NAME}


def _remove(path: Path) -> None:
    import shutil

    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)
