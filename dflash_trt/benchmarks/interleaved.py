"""Loaded schedulers side by side in one process: DFlash (the adaptive policy, as served) against plain decoding,
one step each in turn.

    dflash-trt bench-loaded --engine engines/smollm2-135m --concurrency 4,16,32 --steps 1000

At each concurrency C every mode runs its own scheduler over the same target (and drafter) with C requests in
flight: a request that finishes is replaced at once by the next one of a sequence that every mode gets alike (the
prompts in turn, max_new_tokens +- a spread drawn from a seeded generator, loadgen.request_lengths). The modes take
one step each in turn, their order going through every permutation (A B, B A, ...), and a mode's throughput is the
tokens it committed over the time its own steps took. On a shared machine a drift of the load falls on every mode
within milliseconds: on the 2-core Xeon of README's table two identical plain schedulers agreed within 1% in every
run of 1000 steps, where served rounds of 20 s move by 5-10% (serving.py). What it leaves out is what serving adds
to both alike: Triton, streaming the outputs, the client.

The first `warmup_steps` steps of every mode are not counted: a fresh adaptive policy's first steps draft to measure
what drafting costs (a served benchmark warms its servers up before it measures, too). The counted steps are cut
into `windows` stretches of as many steps; each stretch's ratio is one paired measurement, and stats.ratio_interval
gives the 95% interval of their mean. With plain_control a second plain scheduler runs too: what two identical
schedulers differ by.

Greedy requests: every request's tokens must be the same in every mode ("identical").
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from dflash_trt.benchmarks.in_process import plan_mix
from dflash_trt.benchmarks.loadgen import request_lengths
from dflash_trt.benchmarks.stats import ratio_interval
from dflash_trt.errors import DFlashError

DFLASH, PLAIN, CONTROL = "dflash", "plain", "plain-control"


@dataclass
class ModeRun:
    """One mode's scheduler at one concurrency, and what its counted steps did."""

    scheduler: object
    requests: Callable[[], tuple[list[int], object]]  # the next request of the shared sequence: (prompt, params)
    windows: int
    tokens: int = 0  # committed in counted steps
    seconds: float = 0.0  # the counted steps' own time
    window_tokens: list[int] = field(init=False)  # per window: tokens, seconds
    window_seconds: list[float] = field(init=False)
    outputs: dict = field(default_factory=dict)  # request number (the order of add_request) -> its tokens
    finished: set = field(default_factory=set)
    ended_at: float | None = None  # when this mode's last step ended (the other modes' steps ran since)

    def __post_init__(self):
        self.window_tokens, self.window_seconds = [0] * self.windows, [0.0] * self.windows

    def add_next_request(self) -> None:
        self.scheduler.add_request(*self.requests())

    def step(self, window: int | None) -> None:
        """One scheduler step; window: the stretch it counts in (None: a warm-up step, not counted). The other modes'
        steps since this one's last are not this scheduler's overhead between steps: its policy would count them as
        such, and a policy that thinks every step carries tens of milliseconds more drafts where it does not pay."""
        start = time.perf_counter()
        if self.ended_at is not None:
            self.scheduler.exclude_time(start - self.ended_at)
        outputs = self.scheduler.step()
        for out in outputs:
            self.outputs.setdefault(out.index, []).extend(out.new_token_ids)
            if out.is_final:
                self.finished.add(out.index)
                self.add_next_request()  # each finished request is replaced at once: the batch stays loaded
        self.ended_at = time.perf_counter()
        seconds = self.ended_at - start
        if window is not None:
            new = sum(len(out.new_token_ids) for out in outputs)
            self.tokens += new
            self.seconds += seconds
            self.window_tokens[window] += new
            self.window_seconds[window] += seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def window_rates(self) -> list[float]:
        return [t / s if s else 0.0 for t, s in zip(self.window_tokens, self.window_seconds)]


def request_sequence(prompts: Sequence[list[int]], max_new_tokens: int, spread: int, stop_ids: Sequence[int] = ()
                     ) -> Callable[[], tuple[list[int], object]]:
    """A fresh copy of the shared request sequence: (prompt, greedy SamplingParams), the prompts in turn, each with
    its max tokens, ending at a stop id or there."""
    from dflash_trt.decoding.step.sampling import SamplingParams

    prompt_cycle, lengths = itertools.cycle(prompts), request_lengths(max_new_tokens, spread)
    return lambda: (next(prompt_cycle), SamplingParams(max_new_tokens=next(lengths), stop_token_ids=tuple(stop_ids)))


def new_scheduler(mode: str, target, drafter, block_size: int, concurrency: int, tree_budget: int = 0):
    """DFlash as a served repository runs it (the adaptive policy over the engine's block size, trees up to
    tree_budget), or plain decoding; both hold `concurrency` rows and no prefix cache."""
    from dflash_trt.decoding.scheduler.block_policy import make_policy
    from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits, allowed_block_sizes
    from dflash_trt.decoding.step.verify import tree_or_chain

    limits = SchedulerLimits(max_batch_size=concurrency)
    if mode != DFLASH:
        return Scheduler(target, None, 1, limits)
    policy = make_policy("adaptive", block_size, allowed_block_sizes(drafter, block_size), tree_budget)
    return Scheduler(target, drafter, block_size, limits, policy, tree_or_chain(tree_budget))


def run_level(target, drafter, prompts: Sequence[list[int]], concurrency: int, *, block_size: int, steps: int,
              warmup_steps: int, max_new_tokens: int, spread: int, stop_ids: Sequence[int] = (), windows: int = 10,
              plain_control: bool = False, tree_budget: int = 0) -> dict:
    """Every mode at one concurrency, step by step in turn (module docstring): {mode: tokens/s, ...} with the
    ratios, their interval over the windows, DFlash's plans and whether every request's tokens agree."""
    if steps < windows or windows < 1:
        raise DFlashError(f"steps ({steps}) must be at least windows ({windows}) >= 1")
    modes = [DFLASH, PLAIN] + ([CONTROL] if plain_control else [])
    runs = {}
    for mode in modes:
        runs[mode] = ModeRun(new_scheduler(mode, target, drafter, block_size, concurrency, tree_budget),
                             request_sequence(prompts, max_new_tokens, spread, stop_ids), windows)
        for _ in range(concurrency):
            runs[mode].add_next_request()
    take_turns(runs, steps, warmup_steps, windows)
    return summarize(runs, concurrency)


def take_turns(runs: dict[str, ModeRun], steps: int, warmup_steps: int, windows: int) -> None:
    """warmup_steps + steps steps of every mode, one each in turn, the order going through every permutation of the
    modes (two modes: A B, B A, ...; three: all six orders), so that no mode always runs first, in the middle or after
    the same neighbour (whose memory traffic the next step pays for in cache misses); counted steps are spread
    evenly over the windows."""
    orders = itertools.cycle(itertools.permutations(runs))
    for step in range(warmup_steps + steps):
        window = None if step < warmup_steps else (step - warmup_steps) * windows // steps
        for mode in next(orders):
            runs[mode].step(window)


def summarize(runs: dict[str, ModeRun], concurrency: int) -> dict:
    """The figures of one level (run_level)."""
    dflash, plain = runs[DFLASH], runs[PLAIN]
    result = {"concurrency": concurrency, "tokens_per_s": {mode: run.tokens_per_s for mode, run in runs.items()},
              "tokens": {mode: run.tokens for mode, run in runs.items()},
              "speedup": _ratio(dflash.tokens_per_s, plain.tokens_per_s),
              "speedup_interval": _interval(dflash, plain),
              "plans": plan_mix(dflash.scheduler.policy.steps_run)}  # warm-up included
    result["compared"], result["identical"] = _compared(runs)
    if CONTROL in runs:
        result["control"] = _ratio(plain.tokens_per_s, runs[CONTROL].tokens_per_s)
        result["control_interval"] = _interval(plain, runs[CONTROL])
    return result


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _interval(run: ModeRun, baseline: ModeRun) -> tuple[float, float] | None:
    return ratio_interval([_ratio(a, b) for a, b in zip(run.window_rates(), baseline.window_rates())])


def _compared(runs: dict[str, ModeRun]) -> tuple[int, bool]:
    """(requests finished in every mode, whether each got the same tokens in every mode: greedy, they must)."""
    finished = set.intersection(*(run.finished for run in runs.values()))
    reference = runs[PLAIN].outputs
    return len(finished), all(run.outputs[index] == reference[index] for run in runs.values() for index in finished)


def describe(result: dict) -> str:
    """One line per level for the command's output."""
    rates = result["tokens_per_s"]
    interval = result["speedup_interval"]
    line = (f"concurrency {result['concurrency']}: DFlash {rates[DFLASH]:.1f} tok/s, plain {rates[PLAIN]:.1f} tok/s, "
            f"DFlash / plain {result['speedup']:.3f}x")
    if interval:
        line += f" (95% interval {interval[0]:.3f}-{interval[1]:.3f}x)"
    if "control" in result:
        control = result["control_interval"]
        line += f"; plain / plain-control {result['control']:.3f}x"
        if control:
            line += f" ({control[0]:.3f}-{control[1]:.3f}x)"
    plans = ", ".join(f"{plan}: {count}" for plan, count in result["plans"].items())
    same = "identical" if result["identical"] else "DIFFER"
    return line + f"; DFlash plans {{{plans}}}; outputs of {result['compared']} requests {same}"
