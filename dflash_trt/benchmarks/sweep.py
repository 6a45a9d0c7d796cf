"""In-process block-size sweep: every prompt runs at block size 1 and at each swept size, interleaved.

The order of the runs rotates from prompt to prompt, so a slow phase of a shared machine hits every
block size alike. Figures per (family, block size) come from dflash_trt.benchmarks.in_process.BenchReport, with the
block size 1 runs of the same prompts as its baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from dflash_trt.benchmarks.in_process import BenchReport
from dflash_trt.decoding.api import generate
from dflash_trt.decoding.step.results import GenerationResult
from dflash_trt.decoding.step.sampling import SamplingParams

WARMUP_TOKENS = 8


@dataclass
class SweepResult:
    """results[block_size][i] is prompt i's generation at that block size (1 = plain decoding)."""

    block_sizes: tuple[int, ...]
    families: list[str]  # family of prompt i
    results: dict[int, list[GenerationResult]] = field(default_factory=dict)

    @property
    def family_names(self) -> list[str]:
        return list(dict.fromkeys(self.families))

    def report(self, block_size: int, family: str | None = None) -> BenchReport:
        """DFlash at block_size against block size 1, on one family's prompts (None: all)."""
        rows = [i for i, f in enumerate(self.families) if family is None or f == family]
        return BenchReport(block_size, dflash=[self.results[block_size][i] for i in rows],
                           baseline=[self.results[1][i] for i in rows])


def run_order(block_sizes: tuple[int, ...], index: int) -> list[int]:
    """Block size 1 and the swept sizes, rotated by the prompt's index."""
    modes = [1, *block_sizes]
    shift = index % len(modes)
    return modes[shift:] + modes[:shift]


def run_sweep(target, drafter, prompts: list[list[int]], families: list[str], params: SamplingParams,
              block_sizes: tuple[int, ...], progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Generate every prompt at block size 1 and at every size in block_sizes (one sequence at a time)."""
    sweep = SweepResult(tuple(block_sizes), list(families), {size: [] for size in (1, *block_sizes)})
    # Warm-up: the first forward at each shape pays for allocations and kernel selection.
    warmup = SamplingParams(max_new_tokens=min(WARMUP_TOKENS, params.max_new_tokens))
    for size in (1, *block_sizes):
        _generate(target, drafter, prompts[0], warmup, size)
    for index, prompt in enumerate(prompts):
        for size in run_order(sweep.block_sizes, index):
            sweep.results[size].append(_generate(target, drafter, prompt, params, size))
        if progress is not None:
            progress(index + 1, len(prompts))
    return sweep


def _generate(target, drafter, prompt: list[int], params: SamplingParams, block_size: int) -> GenerationResult:
    return generate(target, drafter if block_size > 1 else None, [prompt], params, block_size=block_size)[0]
