"""Training data: the target's own greedy answers to the training prompts.

Generated with the library's in-flight batching scheduler (plain greedy decoding, many answers at
once, a finished answer replaced by the next prompt at once). Each record stores the token ids of
prompt + response and the prompt length (the response mask is ``position >= prompt_len``). Records
are appended as answers finish, so an interrupted run resumes where it stopped; shards let several processes split the prompts. A prompt counts as answered when any
answers file of the directory holds it, whichever shard or import (``import_answers``) wrote it.
"""

from __future__ import annotations

import glob
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.data.prompts import FAMILIES, load_prompts, prompt_messages


@dataclass
class AnswerConfig:
    """Answer generation settings."""

    prompts: str = "data/prompts"
    out: str = "out/drafter-data"
    target: str = "smollm2"
    max_prompts: int = 2000
    max_new_tokens: int = 384
    batch_size: int = 32
    shard: int = 0
    num_shards: int = 1
    seed: int = 0
    threads: int = 1
    # Only prompts of these families ("sharegpt-chat,champ-math"; empty: all); indices stay global.
    families: str = ""
    # Start a new answers file every this many records of the shard (0: one file), so files that
    # are full never change again and can be committed while generation goes on.
    chunk_records: int = 0


def ordered_prompts(root: str, max_prompts: int, seed: int) -> list[tuple[str, object]]:
    """Training prompts in a deterministic order: the template families shuffled (as they always were),
    then the source families shuffled. Any prefix of a group is balanced over its families, and adding
    source families leaves the indices of template prompts, and so their committed answers, unchanged."""
    present = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
    items = []
    for group in ([f for f in present if f in FAMILIES], [f for f in present if f not in FAMILIES]):
        part = load_prompts(root, "train", tuple(group)) if group else []
        random.Random(seed).shuffle(part)
        items += part
    return items[:max_prompts]


def chat_ids(tok, prompt) -> list[int]:
    """Token ids of the prompt (a string or chat messages) with the chat template and the assistant header."""
    text = tok.apply_chat_template(prompt_messages(prompt), tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def answered_indices(out: str | Path) -> set[int]:
    """Prompt indices answered in any answers file of a data directory (whatever shard wrote them)."""
    return {r["idx"] for r in read_answers(out)}


def answer_files(source: str | Path) -> list[Path]:
    """The answer files a source names: every `answers.*.jsonl` of a directory, or the files a glob
    pattern matches (e.g. `dir/answers.?-of-2.*.jsonl`, the chunks a later run added)."""
    from dflash_trt.errors import DFlashError

    if Path(source).is_dir():
        return sorted(Path(source).glob("answers.*.jsonl"))
    files = sorted(Path(p) for p in glob.glob(str(source)))
    if not files:
        raise DFlashError(f"{source}: neither a directory nor a pattern matching answer files")
    return files


def import_answers(source: str | Path, out: str | Path, prompts: str, max_prompts: int, seed: int = 0,
                   per_family: dict[str, int] | None = None) -> int:
    """Copy answers from a directory or a glob pattern of answer files into a data directory.

    A record is taken only when its index is among the first `max_prompts` training prompts and its
    prompt text is the one at that index here, so answers to another prompt set or order never leak
    in; indices the data directory already holds are skipped. `per_family` caps how many answers of
    a family the data directory may hold (the lowest prompt indices, a random sample since the
    prompts are shuffled): a replay of the template answers while training on new ones costs a
    fraction of their feature pass. Returns the number of records copied.
    """
    expected = {i: p for i, (_, p) in enumerate(ordered_prompts(prompts, max_prompts, seed))}
    held = read_answers(out)
    have = {r["idx"] for r in held}
    per_family_held = Counter(r["family"] for r in held)
    caps = per_family or {}
    new = []
    for rec in sorted((r for f in answer_files(source) for r in read_answer_file(f)), key=lambda r: r["idx"]):
        if expected.get(rec["idx"]) != rec["prompt"] or rec["idx"] in have:
            continue
        if per_family_held[rec["family"]] >= caps.get(rec["family"], math.inf):
            continue
        per_family_held[rec["family"]] += 1
        have.add(rec["idx"])
        new.append(rec)
    if new:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / "answers.imported.jsonl", "a", encoding="utf-8") as f:
            for rec in new:
                f.write(json.dumps(rec) + "\n")
    return len(new)


def generate_answers(cfg: AnswerConfig) -> Path:
    """Generate (resumably) this shard's answers; returns the shard's JSON-lines file.

    The prompts go through the in-flight batching scheduler with plain greedy decoding: up to
    `batch_size` answers are decoded together, a finished answer leaves the batch at once and the next
    prompt takes its place, so no row is computed past its end and no prompt is padded to a longer one.
    Each answer is the target's greedy answer alone (the scheduler's promise), written when it finishes.
    """
    import torch
    from tqdm import tqdm

    from dflash_trt.decoding.model.target import TargetModel
    from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.errors import DFlashError
    from dflash_trt.training.target_io import SMOLLM2_STOP_IDS, load_hf_target

    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"answers.{cfg.shard}-of-{cfg.num_shards}.jsonl"
    families = {f.strip() for f in cfg.families.split(",") if f.strip()}
    items = [(i, f, p) for i, (f, p) in enumerate(ordered_prompts(cfg.prompts, cfg.max_prompts, cfg.seed))
             if i % cfg.num_shards == cfg.shard and (not families or f in families)]
    done = answered_indices(out)
    pending = [it for it in items if it[0] not in done]
    if not pending:
        return path
    todo = iter(pending)
    model, tok = load_hf_target(cfg.target)
    stop_ids = SMOLLM2_STOP_IDS if tok.eos_token_id not in SMOLLM2_STOP_IDS and len(tok) == 49152 else (tok.eos_token_id,)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, stop_token_ids=tuple(stop_ids))
    scheduler = Scheduler(TargetModel(model, tok, source=cfg.target), None, block_size=1,
                          limits=SchedulerLimits(max_batch_size=cfg.batch_size, max_kv_tokens=None))
    in_flight: dict = {}
    bar = tqdm(total=len(items), initial=len(items) - len(pending), desc=f"answers shard {cfg.shard}")
    t0, ntok = time.time(), 0

    def refill() -> None:
        while len(in_flight) < cfg.batch_size and (item := next(todo, None)) is not None:
            prompt_ids = chat_ids(tok, item[2])
            try:
                in_flight[scheduler.add_request(prompt_ids, params)] = (item, prompt_ids)
            except DFlashError as error:  # e.g. a prompt longer than the target's context: skipped
                print(f"answers: prompt {item[0]} skipped ({error})")

    refill()
    while scheduler.has_unfinished:
        for step in scheduler.step():
            if not step.is_final:
                continue
            (idx, fam, prompt), prompt_ids = in_flight.pop(step.index)
            ntok += len(step.result.token_ids)
            rec = {"idx": idx, "family": fam, "prompt": prompt, "ids": prompt_ids + step.result.token_ids,
                   "prompt_len": len(prompt_ids)}
            with open(answers_file(out, cfg, path), "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            bar.update(1)
            bar.set_postfix(tok_s=f"{ntok / (time.time() - t0):.1f}")
        refill()
    bar.close()
    return path


def answers_file(out: Path, cfg: AnswerConfig, single: Path) -> Path:
    """The file the next record of this shard goes to: `single`, or the first chunk file not yet full."""
    if cfg.chunk_records <= 0:
        return single
    stem = f"answers.{cfg.shard}-of-{cfg.num_shards}"
    chunk = 0
    while (path := out / f"{stem}.{chunk:04d}.jsonl").exists() and \
            sum(1 for line in path.open(encoding="utf-8") if line.strip()) >= cfg.chunk_records:
        chunk += 1
    return path


def read_answers(out: str) -> list[dict]:
    """All answer records of a data directory, sorted by prompt index."""
    recs = [r for p in (answer_files(out) if Path(out).is_dir() else []) for r in read_answer_file(p)]
    return sorted(recs, key=lambda r: r["idx"])


def read_answer_file(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="generate the target's greedy answers to the training prompts")
    for k, v in AnswerConfig.__dataclass_fields__.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v.default), default=v.default)
    generate_answers(AnswerConfig(**vars(ap.parse_args())))
