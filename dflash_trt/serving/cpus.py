"""How many CPU threads a model instance may use, so that instances x threads never exceeds the cores."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cpus() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a container's limit)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def default_num_threads(instances: int, cpus: int | None = None) -> int:
    """Torch threads per model instance so that instances x threads never exceeds the cores."""
    return max(1, (cpus or usable_cpus()) // max(1, instances))
