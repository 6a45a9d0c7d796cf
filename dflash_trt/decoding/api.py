"""The library's generation API: fixed batches run through the in-flight scheduler.

    results = generate(target, drafter, [prompt_ids], SamplingParams(max_new_tokens=64))
    for out in stream_generate(target, drafter, prompt_ids, params): ...

Every prompt starts at once and the block size is pinned (FixedBlockSize), so a call reproduces the
reference loop of dflash.md; `policy=` hands the choice of each step to a BlockSizePolicy instead (e.g. one
AdaptiveBlockSize shared by a benchmark's calls, as a server's would be). Serving drives a Scheduler directly.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from dflash_trt.decoding.model.protocols import Drafter, Target
from dflash_trt.decoding.scheduler.block_policy import BlockSizePolicy, FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.results import GenerationResult, StepOutput
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.step import resolve_block_size
from dflash_trt.decoding.step.verify import VerifyMethod
from dflash_trt.errors import DFlashError


def stream_generate(target: Target, drafter: Drafter | None, prompt: Sequence[int],
                    params: SamplingParams, block_size: int | None = None, method: VerifyMethod | None = None,
                    policy: BlockSizePolicy | None = None) -> Iterator[StepOutput]:
    """Generate for one prompt, yielding the tokens committed at every step as soon as they exist."""
    yield from decode(target, drafter, [prompt], [params], block_size, method, policy)


def generate(target: Target, drafter: Drafter | None, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams], block_size: int | None = None,
             method: VerifyMethod | None = None, policy: BlockSizePolicy | None = None) -> list[GenerationResult]:
    """Generate for a batch of prompts; returns one GenerationResult per prompt, in order. method: how drafts
    are verified (default the chain; step.verify.TreeVerify(budget, top_k) for a tree); policy: what each
    step verifies (default: block_size every step, FixedBlockSize)."""
    params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    results: list[GenerationResult | None] = [None] * len(prompts)
    for step in decode(target, drafter, prompts, params_list, block_size, method, policy):
        if step.is_final:
            results[step.index] = step.result
    return results  # type: ignore[return-value]


def decode(target: Target, drafter: Drafter | None, prompts: Sequence[Sequence[int]],
           params_list: Sequence[SamplingParams], block_size: int | None = None,
           method: VerifyMethod | None = None, policy: BlockSizePolicy | None = None) -> Iterator[StepOutput]:
    """The speculative loop of dflash.md over a fixed batch (every prompt starts at once, block size
    pinned); yields a StepOutput per sequence and step; StepOutput.index is the prompt's position."""
    if len(params_list) != len(prompts):
        raise DFlashError("one SamplingParams per prompt is required")
    size = resolve_block_size(drafter, block_size)
    scheduler = Scheduler(target, drafter, size, SchedulerLimits(max_batch_size=max(1, len(prompts)),
                                                                 max_kv_tokens=None, prefill_chunk_tokens=None),
                          policy or FixedBlockSize(size), method)
    for index, (prompt, params) in enumerate(zip(prompts, params_list)):
        scheduler.add_request(prompt, params, request_id=index)
    while scheduler.has_unfinished:
        yield from scheduler.step()
