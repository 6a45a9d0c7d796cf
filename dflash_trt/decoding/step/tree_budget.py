"""The rule a tree budget follows, without torch: the verification methods, the policy, the CLI and the repository
renderer (which never loads torch) all check a budget here, with one message."""

from __future__ import annotations

from dflash_trt.errors import DFlashError


def check_tree_budget(budget) -> int:
    """An integer >= 0, 0 meaning the chain; returns it, or raises a one-line DFlashError."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise DFlashError(f"tree budget must be >= 0 (0 means the chain), got {budget!r}")
    return budget
