"""The Python model processes (stubs) of a running tritonserver, seen through /proc (Linux).

Triton does not restart a dead stub of a decoupled model and keeps answering ready (server#8604,
#7862): requests to it hang or fail with "Stub process ... is not healthy". The server's supervisor
(server.py) therefore records the stubs once the server is ready and checks that every one of them
is still there; a stub's command line names its model instance (`dflash_0_0`).

Also here: ending every process of the server (its process group) and removing the shared-memory
regions its Python backend created (named by the per-server prefix given to Triton).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

STUB_NAME = "triton_python_backend_stub"
# The prefix of a server's regions: dflash_<pid of its supervisor>_<8 hex digits>_ (server.py).
_PREFIX = re.compile(r"dflash_(\d+)_([0-9a-f]{8})_")
SHM_DIR = Path("/dev/shm")
# Where a stub's command line names its model instance (python_backend's stub launcher).
_INSTANCE_ARG = 8


@dataclass(frozen=True)
class ModelProcess:
    pid: int
    instance: str  # e.g. dflash_0_0
    start_time: int  # clock ticks after boot: tells a recycled pid from the recorded process


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    return text[text.rindex(")") + 2:].split()


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _parent_map() -> dict[int, int]:
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields:
                parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root: int) -> list[int]:
    """Every process below `root` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parent_map().items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def model_processes(root: int) -> list[ModelProcess]:
    """The Python backend stubs below process `root` (tritonserver, or the launcher that runs it)."""
    found = []
    for pid in descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or Path(argv[0].decode(errors="replace")).name != STUB_NAME:
            continue
        instance = argv[_INSTANCE_ARG].decode(errors="replace") if len(argv) > _INSTANCE_ARG else "?"
        fields = _stat_fields(pid)
        if fields:
            found.append(ModelProcess(pid, instance, int(fields[19])))
    return sorted(found, key=lambda p: p.instance)


def is_running(process: ModelProcess) -> bool:
    """The recorded process still exists (same start time) and is not a zombie."""
    fields = _stat_fields(process.pid)
    return bool(fields) and fields[0] not in ("Z", "X") and int(fields[19]) == process.start_time


def kill_group(pgid: int, signum: int = signal.SIGKILL) -> bool:
    """Signal every process of a process group; False when the group is already empty."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member we may not signal: the group still exists


def shm_regions(prefix: str, directory: Path = SHM_DIR) -> list[Path]:
    """Shared-memory regions whose names start with the server's prefix."""
    if not prefix or not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(prefix))


def remove_shm_regions(prefix: str, directory: Path = SHM_DIR) -> list[Path]:
    """Remove the regions a stopped server left behind; returns what was removed."""
    removed = []
    for path in shm_regions(prefix, directory):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def shm_prefix(supervisor_pid: int, token: str) -> str:
    return f"dflash_{supervisor_pid}_{token}_"


def remove_stale_shm_regions(directory: Path = SHM_DIR, own_pid: int | None = None) -> list[Path]:
    """Remove regions left by servers whose supervisor is gone (killed without its clean-up, e.g. by the
    OOM killer; a pod's /dev/shm outlives a container restart). Called before this supervisor starts a
    server, so a region named by its own pid is stale too: that pid was reused from a previous container."""
    own_pid = os.getpid() if own_pid is None else own_pid
    removed = []
    if not directory.is_dir():
        return removed
    for path in directory.iterdir():
        match = _PREFIX.match(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != own_pid and Path(f"/proc/{pid}").exists():
            continue  # another live server's
        try:
            path.unlink()
            removed.append(path)
        except (FileNotFoundError, PermissionError):
            pass
    return removed
