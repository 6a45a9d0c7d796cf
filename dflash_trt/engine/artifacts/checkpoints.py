"""The target and drafter directories of an engine, in the form the torch runtime loads fast.

A GGUF target is dequantized once into a Hugging Face safetensors directory with its tokenizer (loading
GGUF dequantizes on every load, ~20 s for the demo model). A Hugging Face directory is linked, not copied.
A small drafter is copied so the engine is self-contained; a large one is linked.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from dflash_trt.engine.resolve import ResolvedCheckpoint

COPY_LIMIT_BYTES = 1 << 30  # drafters below this are copied into the engine


def place_target(target: ResolvedCheckpoint, out: Path, dtype: str, log: Callable[[str], None]) -> None:
    """Write or link the target at `out` (a directory path inside the engine)."""
    _clear(out)
    if target.is_gguf:
        log(f"  dequantizing {target.path.name} once into {out} ({dtype} safetensors + tokenizer)")
        _convert_gguf(target.path, out, dtype)
    else:
        log(f"  linking {out} -> {target.path}")
        os.symlink(target.path, out, target_is_directory=True)


def place_drafter(drafter: ResolvedCheckpoint, out: Path, log: Callable[[str], None]) -> None:
    _clear(out)
    size = sum(p.stat().st_size for p in drafter.path.rglob("*") if p.is_file())
    if size < COPY_LIMIT_BYTES:
        log(f"  copying drafter {drafter.path} -> {out} ({size / 2**20:.1f} MiB)")
        shutil.copytree(drafter.path, out, ignore=shutil.ignore_patterns(".git*", "*.md", ".cache"))
    else:
        log(f"  linking {out} -> {drafter.path} ({size / 2**30:.1f} GiB)")
        os.symlink(drafter.path, out, target_is_directory=True)


def _convert_gguf(gguf: Path, out: Path, dtype: str) -> None:
    import torch

    from dflash_trt.decoding.model.target import load_target

    target = load_target(gguf, dtype=getattr(torch, dtype))
    tmp = out.with_name(out.name + ".tmp")
    _clear(tmp)
    target.model.save_pretrained(tmp, safe_serialization=True)
    if target.tokenizer is not None:
        target.tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # a half-written directory never looks finished


def _clear(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
