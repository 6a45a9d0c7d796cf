"""Deterministic prompt sets per family, with held-out prompts that training never sees.

The split is by a hash of the prompt text, so it does not depend on generation order: a prompt
text lands in the held-out set or the training set, never both (duplicates are removed first).

Files: ``<root>/<family>/{train,heldout}.jsonl``, one JSON object per line with a ``prompt`` field.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.data.templates import GENERATORS

FAMILIES = tuple(GENERATORS)


@dataclass
class PromptSetConfig:
    """How many prompts per family and which share is held out."""

    train_per_family: int = 1500
    heldout_per_family: int = 48
    heldout_percent: int = 5
    seed: int = 0


def is_heldout(prompt: str, percent: int) -> bool:
    """Hash-based split: stable across runs, machines and generation order."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def build_prompt_sets(cfg: PromptSetConfig | None = None) -> dict[str, dict[str, list[str]]]:
    """Return {family: {"train": [...], "heldout": [...]}} built from the family templates."""
    cfg = cfg or PromptSetConfig()
    out = {}
    for fi, family in enumerate(FAMILIES):
        rng = random.Random(f"{cfg.seed}:{family}")
        gen = GENERATORS[family]
        train, heldout, seen = [], [], set()
        # Bounded attempts: small template spaces may not reach the requested count.
        for _ in range(50 * (cfg.train_per_family + cfg.heldout_per_family)):
            if len(train) >= cfg.train_per_family and len(heldout) >= cfg.heldout_per_family:
                break
            p = gen(rng)
            if p in seen:
                continue
            seen.add(p)
            bucket = heldout if is_heldout(p, cfg.heldout_percent) else train
            limit = cfg.heldout_per_family if bucket is heldout else cfg.train_per_family
            if len(bucket) < limit:
                bucket.append(p)
        out[family] = {"train": train, "heldout": heldout}
    return out


def write_prompt_sets(root: str | Path, cfg: PromptSetConfig | None = None) -> dict[str, dict[str, int]]:
    """Write the prompt files under root; returns the counts per family and split."""
    root = Path(root)
    counts = {}
    for family, splits in build_prompt_sets(cfg).items():
        (root / family).mkdir(parents=True, exist_ok=True)
        counts[family] = {}
        for split, prompts in splits.items():
            with open(root / family / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for p in prompts:
                    f.write(json.dumps({"prompt": p, "family": family}) + "\n")
            counts[family][split] = len(prompts)
    return counts


def load_prompts(root: str | Path, split: str, families: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """Read (family, prompt) pairs of one split. Accepts JSON lines with `prompt` or plain text lines."""
    root = Path(root)
    out = []
    for family in families or sorted(p.name for p in root.iterdir() if p.is_dir()):
        for ext in ("jsonl", "txt"):
            path = root / family / f"{split}.{ext}"
            if path.exists():
                break
        else:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            out.append((family, json.loads(line)["prompt"] if ext == "jsonl" else line))
    return out


if __name__ == "__main__":
    import sys

    print(write_prompt_sets(sys.argv[1] if len(sys.argv) > 1 else "data/prompts"))
