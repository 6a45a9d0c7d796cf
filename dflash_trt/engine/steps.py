"""Step bookkeeping for the builder: progress lines, idempotent skips, and steps this machine cannot run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dflash_trt.engine.needs import StepUnavailable

STAMP_DIR = ".steps"


@dataclass
class Progress:
    """Numbered progress output: [3/6] plan parallelism."""

    total: int
    log: Callable[[str], None] = print
    done: int = 0

    def step(self, title: str) -> None:
        self.done += 1
        self.log(f"[{self.done}/{self.total}] {title}")


@dataclass
class Pending:
    """Steps that could not run here; `blocking` ones leave the engine unusable for its runtime."""

    items: list[dict[str, Any]] = field(default_factory=list)

    def add(self, exc: StepUnavailable, blocking: bool) -> None:
        self.items.append({"step": exc.step, "needs": exc.missing, "blocking": blocking, "message": str(exc)})

    def skipped(self, step: str, after: str, blocking: bool = True) -> None:
        self.items.append({"step": step, "needs": f"step '{after}'", "blocking": blocking,
                           "message": f"step '{step}' skipped: it needs the output of step '{after}'"})

    def has(self, step: str) -> bool:
        return any(item["step"] == step for item in self.items)

    def first_error(self) -> StepUnavailable | None:
        for item in self.items:
            if item["needs"].startswith("step '"):
                continue
            error = StepUnavailable(item["step"], item["needs"])
            error.args = (item["message"],)
            return error
        return None


def is_fresh(engine_dir: Path, step: str, fingerprint: dict[str, Any], outputs: list[Path]) -> bool:
    """True when `step` already ran with the same inputs and its outputs are still there."""
    stamp = engine_dir / STAMP_DIR / f"{step}.json"
    if not stamp.is_file() or not all(p.exists() for p in outputs):
        return False
    try:
        return json.loads(stamp.read_text()) == fingerprint
    except json.JSONDecodeError:
        return False


def mark_done(engine_dir: Path, step: str, fingerprint: dict[str, Any]) -> None:
    stamp = engine_dir / STAMP_DIR / f"{step}.json"
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(fingerprint, sort_keys=True))


def clear_stamp(engine_dir: Path, step: str) -> None:
    (engine_dir / STAMP_DIR / f"{step}.json").unlink(missing_ok=True)


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Cheap identity of a checkpoint (path, size, mtime of its files), not a content hash."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {"path": str(path), "files": [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files]}


def run_step(name: str, engine_dir: Path, fingerprint: dict[str, Any], outputs: list[Path],
             action: Callable[[], None], log: Callable[[str], None]) -> None:
    """Run `action` unless the step is fresh; stamp it when it succeeds."""
    if is_fresh(engine_dir, name, fingerprint, outputs):
        log(f"  {name}: up to date")
        return
    clear_stamp(engine_dir, name)
    action()
    mark_done(engine_dir, name, fingerprint)


def unavailable(pending: Pending, exc: StepUnavailable, blocking: bool, log: Callable[[str], None]) -> None:
    log(f"  {exc.step}: not possible here ({exc.missing}); continuing with the other steps")
    pending.add(exc, blocking)
