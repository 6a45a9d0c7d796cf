"""Runtime steps of the trtllm runtime: link the checkpoints, write the LLM-API options, check them."""

from __future__ import annotations

import os
from pathlib import Path

from . import steps
from .artifacts import trtllm
from .build import unavailable
from .needs import StepUnavailable
from .presets import Preset
from .quantize import quantize_target


def build_trtllm(preset: Preset, pair, engine_dir: Path, progress: steps.Progress,
                 pending: steps.Pending) -> dict[str, str]:
    log = progress.log
    progress.step(f"prepare the target, quantize ({preset.quant})")
    try:
        quantize_target(preset.quant, preset.runtime, pair.target.path, engine_dir / "quantization", preset.dtype, log)
    except StepUnavailable as exc:
        unavailable(pending, exc, True, log)

    progress.step("write trtllm artifacts")
    for name, found in (("target", pair.target), ("drafter", pair.drafter)):
        link = engine_dir / name
        if link.is_symlink() and link.resolve() == found.path:
            log(f"  {name}: up to date")
            continue
        if link.is_symlink() or link.exists():
            _remove(link)
        os.symlink(found.path, link, target_is_directory=True)
        log(f"  linking {link} -> {found.path}")

    options = trtllm.trtllm_options(preset, pair.arch, pair.drafter_config, pair.drafter.path)
    path = engine_dir / trtllm.OPTIONS_NAME
    trtllm.write_options(options, path, str(pair.target.path))
    log(f"  wrote {path} (TensorRT-LLM {trtllm.TRTLLM_VERSION} fields)")
    try:
        version = trtllm.check_with_trtllm(options, pair.target.path)
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
