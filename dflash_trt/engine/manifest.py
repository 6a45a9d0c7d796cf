"""manifest.json: what an engine directory holds, with a SHA-256 of every file, written last.

The runtimes and the Triton layer read an engine only through its manifest, so a build that stopped
half-way (no manifest) or a file changed after the build (hash mismatch) is refused at load time.
Checkpoints linked rather than copied (large HF targets) are recorded under `external` with the hash
of their config.json only; hashing tens of GB on every load would make loading slow.
"""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dflash_trt.errors import DFlashError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
_CHUNK = 1 << 22


class EngineError(DFlashError):
    """An engine directory is missing, incomplete, or was modified after it was built."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_tree(engine_dir: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {sha256, size}} of every regular file under engine_dir, not following links."""
    files = {}
    for path in sorted(engine_dir.rglob("*")):
        rel = path.relative_to(engine_dir).as_posix()
        if rel == MANIFEST_NAME or rel.startswith(".steps/") or _under_link(path, engine_dir):
            continue
        if path.is_file() and not path.is_symlink():
            files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return files


def external_entry(link: Path) -> dict[str, Any]:
    """A linked checkpoint: where it points and the hash of its config.json."""
    target = link.resolve()
    config = target / "config.json" if target.is_dir() else target
    return {"path": str(target), "config_sha256": sha256_file(config)}


def tool_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("dflash-trt", "torch", "transformers", "nvidia-modelopt", "onnx", "onnxruntime", "tensorrt",
                 "tensorrt_llm"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def write_manifest(engine_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Hash the engine directory and write manifest.json (atomically) with `fields` added."""
    links = {name: external_entry(engine_dir / name) for name in ("target", "drafter")
             if (engine_dir / name).is_symlink()}
    manifest = {
        "format": FORMAT_VERSION,
        **fields,
        "files": hash_tree(engine_dir),
        "external": links,
        "tools": tool_versions(),
        "built_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    tmp = engine_dir / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(engine_dir / MANIFEST_NAME)
    return manifest


def read_manifest(engine_dir: str | Path, verify: bool = True) -> dict[str, Any]:
    """Read an engine's manifest; with verify=True every file's hash is checked first."""
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_NAME
    if not path.is_file():
        hint = " (the build did not finish: run `make engine` again)" if engine_dir.is_dir() else ""
        raise EngineError(f"{engine_dir}: no {MANIFEST_NAME}, not a built engine{hint}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise EngineError(f"{path}: not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT_VERSION:
        raise EngineError(f"{path}: manifest format {manifest.get('format')!r}, expected {FORMAT_VERSION}; rebuild it")
    if verify:
        verify_files(engine_dir, manifest)
    return manifest


def verify_files(engine_dir: Path, manifest: dict[str, Any]) -> None:
    for rel, entry in manifest.get("files", {}).items():
        path = engine_dir / rel
        if not path.is_file():
            raise EngineError(f"{engine_dir}: {rel} is listed in the manifest but missing; rebuild the engine")
        if path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
            raise EngineError(f"{engine_dir}: {rel} does not match its manifest hash (modified or corrupted "
                              "after the build); rebuild the engine")
    for name, entry in manifest.get("external", {}).items():
        config = Path(entry["path"])
        config = config / "config.json" if config.is_dir() else config
        if not config.is_file():
            raise EngineError(f"{engine_dir}: linked {name} checkpoint {entry['path']} is gone; rebuild the engine")
        if sha256_file(config) != entry["config_sha256"]:
            raise EngineError(f"{engine_dir}: linked {name} checkpoint {entry['path']} changed since the build; "
                              "rebuild the engine")


def _under_link(path: Path, root: Path) -> bool:
    rel = path.relative_to(root)
    return any((root / Path(*rel.parts[:i])).is_symlink() for i in range(1, len(rel.parts)))
