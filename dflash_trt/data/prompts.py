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


def prompt_messages(prompt) -> list[dict]:
    """Chat messages of a prompt: a string is one user turn; a list is a conversation ending on a user turn."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                        and m.get("role") in ("system", "user", "assistant")
                                                        for m in prompt) and prompt[-1]["role"] == "user"):
        raise ValueError("a prompt is a string or a list of {role, content} messages ending on a user turn")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def load_prompts(root: str | Path, split: str, families: tuple[str, ...] | None = None) -> list[tuple[str, object]]:
    """Read (family, prompt) pairs of one split. Accepts JSON lines with `prompt` or plain text lines.

    A prompt is a string, or for multi-turn families a list of chat messages (see prompt_messages).
    """
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
