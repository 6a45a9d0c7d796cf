"""The held-out prompt sets: <dir>/<family>/heldout.jsonl, never seen by drafter training."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.benchmarks.in_process import PromptRecord, load_prompts
from dflash_trt.errors import DFlashError

HELDOUT = "heldout.jsonl"


def available_families(prompts_dir: Path) -> tuple[str, ...]:
    return tuple(sorted(p.parent.name for p in Path(prompts_dir).glob(f"*/{HELDOUT}")))


def heldout_prompts(prompts_dir: Path, families: tuple[str, ...], num_prompts: int) -> list[PromptRecord]:
    """The first num_prompts of each family, interleaved family by family.

    Interleaving spreads any drift of a shared machine's load evenly over the families.
    """
    families = families or available_families(prompts_dir)
    if not families:
        raise DFlashError(f"{prompts_dir}: no <family>/{HELDOUT} prompt sets")
    per_family = []
    for family in families:
        path = Path(prompts_dir) / family / HELDOUT
        if not path.is_file():
            known = ", ".join(available_families(prompts_dir)) or "none"
            raise DFlashError(f"{path}: no held-out prompts for family {family!r} (known: {known})")
        records = load_prompts(path)[:num_prompts]
        per_family.append([PromptRecord(r.prompt, family) for r in records])
    longest = max(len(records) for records in per_family)
    return [records[i] for i in range(longest) for records in per_family if i < len(records)]
