"""In-process benchmark: DFlash against block_size 1 on the same prompts, interleaved in one run.

speedup = mean decode-phase time per output token of the block_size 1 loop / that of DFlash
(per-generation figures averaged over prompts, prefill and the first draft call excluded).
tau = macro average over generations of the mean acceptance length per verify step.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.scheduler.block_policy import make_policy
from dflash_trt.decoding.step.results import GenerationResult
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.verify import TreeVerify
from dflash_trt.errors import DFlashError


@dataclass
class PromptRecord:
    prompt: str | list  # text, or chat messages ending on a user turn (multi-turn prompt sets)
    family: str = ""


@dataclass
class BenchReport:
    block_size: int
    tree_budget: int = 0  # draft nodes per row of a tree verify (0: the chain; with the adaptive policy: the cap)
    block_policy: str = "fixed"  # "adaptive": one AdaptiveBlockSize chose every DFlash step (plain, chain or tree)
    plans: dict[str, int] = field(default_factory=dict)  # adaptive: steps per plan, e.g. {"chain 8": 90, "tree 16": 9}
    dflash: list[GenerationResult] = field(default_factory=list)
    baseline: list[GenerationResult] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return statistics.fmean(r.tau for r in self.dflash if r.num_verify_steps) if self.dflash else 0.0

    @property
    def speedup(self) -> float:
        dflash = statistics.fmean(r.time_per_output_token for r in self.dflash)
        baseline = statistics.fmean(r.time_per_output_token for r in self.baseline)
        return baseline / dflash if dflash else 0.0

    @property
    def identical(self) -> bool:
        return all(a.token_ids == b.token_ids for a, b in zip(self.dflash, self.baseline))

    @property
    def acceptance_histogram(self) -> dict[int, int]:
        counts = Counter(length for r in self.dflash for length in r.acceptance_lengths)
        return {length: counts.get(length, 0) for length in range(1, self.block_size + 1)}

    def to_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "tree_budget": self.tree_budget,
            "block_policy": self.block_policy,
            "plans": self.plans,
            "num_prompts": len(self.dflash),
            "tau": self.tau,
            "speedup": self.speedup,
            "identical": self.identical,
            "acceptance_histogram": self.acceptance_histogram,
            "tpot_ms": {"dflash": 1e3 * statistics.fmean(r.time_per_output_token for r in self.dflash),
                        "baseline": 1e3 * statistics.fmean(r.time_per_output_token for r in self.baseline)},
            "num_output_tokens": {"dflash": sum(r.num_output_tokens for r in self.dflash),
                                  "baseline": sum(r.num_output_tokens for r in self.baseline)},
        }


def load_prompts(path: str | Path) -> list[PromptRecord]:
    """One prompt per line, or JSON lines with a `prompt` field (and optionally `family`).

    A JSON `prompt` is a string, or a list of chat messages (`role`, `content`) ending on a user turn.
    """
    path = Path(path)
    if not path.is_file():
        raise DFlashError(f"{path}: prompt file not found")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                item = json.loads(line)
                prompt = item["prompt"] if isinstance(item["prompt"], list) else str(item["prompt"])
                records.append(PromptRecord(prompt, str(item.get("family", ""))))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DFlashError(f"{path}:{number}: expected a JSON object with a 'prompt' field") from None
        else:
            records.append(PromptRecord(line))
    if not records:
        raise DFlashError(f"{path}: no prompts")
    return records


def run_benchmark(target, drafter, prompts: list[list[int]], params: SamplingParams, block_size: int | None = None,
                  progress=None, method=None, block_policy: str = "fixed") -> BenchReport:
    """Run every prompt with DFlash and with block_size 1, alternating which goes first. method: how DFlash
    verifies its drafts (default the chain; a TreeVerify for a tree); block_policy "adaptive": one adaptive
    policy, shared by all prompts as a server's is, chooses every DFlash step (plain, a chain, or a tree up to
    the method's budget) instead of pinning block_size and the method."""
    block_size = block_size or drafter.config.block_size
    tree_budget = method.budget if isinstance(method, TreeVerify) else 0
    report = BenchReport(block_size=block_size, tree_budget=tree_budget, block_policy=block_policy)
    policy = make_policy(block_policy, block_size, None, tree_budget) if block_policy == "adaptive" else None
    # Warm-up: the first forward of a process pays for allocations and kernel selection.
    warmup = SamplingParams(max_new_tokens=min(8, params.max_new_tokens))
    generate(target, drafter, [prompts[0]], warmup, block_size=block_size, method=method, policy=policy)
    generate(target, None, [prompts[0]], warmup, block_size=1)
    for index, prompt in enumerate(prompts):
        runs = [("dflash", block_size), ("baseline", 1)]
        if index % 2:
            runs.reverse()
        for mode, size in runs:
            result = generate(target, drafter if size > 1 else None, [prompt], params, block_size=size,
                              method=method if size > 1 else None, policy=policy if size > 1 else None)[0]
            getattr(report, mode).append(result)
        if progress is not None:
            progress(index + 1, len(prompts), report)
    if policy is not None:
        report.plans = plan_mix(policy.steps_run)
    return report


def plan_mix(steps_run) -> dict[str, int]:
    """Steps a policy ran per plan ("plain", "chain S", "tree B"), ordered by tokens verified per sequence."""
    return {_plan_name(plan): count for plan, count in sorted(
        steps_run.items(), key=lambda item: (item[0].verified_tokens, item[0].tree_budget or 0))}


def _plan_name(plan) -> str:
    if plan.block_size == 1:
        return "plain"
    return f"tree {plan.tree_budget}" if plan.tree_budget else f"chain {plan.block_size}"
