"""Build the C++ plugin libraries with CMake (the same build as `make plugins`).

Tests and the `onnx` runtime call `build_plugins` so a clean checkout works without a manual step; the build is
incremental and guarded by a file lock, so parallel callers wait for one another instead of racing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from dflash_trt.errors import DFlashError

PLUGIN_SOURCE_DIR = Path(__file__).resolve().parents[4] / "plugins"
DEFAULT_BUILD_DIR = PLUGIN_SOURCE_DIR / "build"
# Overrides the directory searched for the built libraries (an install without the source tree).
LIBRARY_DIR_ENV = "DFLASH_PLUGIN_DIR"

CPU_TARGET = "dflash_attention_cpu"
ORT_TARGET = "dflash_attention_ort"
TRT_TARGET = "dflash_attention_trt"
CUDA_TARGETS = ("dflash_attention_kernels", "dflash_attention_kernel_test")


class PluginBuildError(DFlashError):
    """CMake could not configure or build the plugin libraries."""


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise PluginBuildError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}")


def build_plugins(targets: tuple[str, ...] = (CPU_TARGET,), build_dir: Path = DEFAULT_BUILD_DIR,
                  jobs: int = 2) -> Path:
    """Configure (once) and build `targets` into build_dir; returns build_dir.

    Raises PluginBuildError when cmake is missing or the build fails.
    """
    if shutil.which("cmake") is None:
        raise PluginBuildError("cmake is not installed; it is needed to build the plugin libraries")
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (build_dir / "CMakeCache.txt").exists():
            _run(["cmake", "-S", str(PLUGIN_SOURCE_DIR), "-B", str(build_dir)])
        _run(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *targets])
    return build_dir


def configured_targets(build_dir: Path = DEFAULT_BUILD_DIR) -> str:
    """The configure summary (what was built and what was skipped, with the reason)."""
    summary = build_dir / "summary.txt"
    return summary.read_text() if summary.exists() else ""


def library_path(target: str, build_dir: Path = DEFAULT_BUILD_DIR) -> Path:
    """Path of lib<target>.so: in $DFLASH_PLUGIN_DIR when set, else in the build tree."""
    directory = Path(os.environ[LIBRARY_DIR_ENV]) if os.environ.get(LIBRARY_DIR_ENV) else build_dir / "lib"
    return directory / f"lib{target}.so"
