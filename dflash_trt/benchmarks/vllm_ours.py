"""Our side of `make bench-vllm`: the same prompts through the in-process Scheduler (the server's batching).

Each measurement mirrors the vLLM runner's: one request at a time over the first `batch1_prompts`
prompts, then the first B prompts added at once as one batch; a short warm-up precedes each. Every
request runs to max_new_tokens (no stop ids, as vLLM's ignore_eos), so both sides emit the same count.
"""

from __future__ import annotations

import time
from typing import Callable

from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.results import GenerationResult
from dflash_trt.decoding.step.sampling import SamplingParams


def run_batch(scheduler: Scheduler, prompts: list[list[int]], params: SamplingParams
              ) -> tuple[float, list[GenerationResult]]:
    """Add every prompt at once and step until all finish; (wall seconds, results in prompt order)."""
    start = time.perf_counter()
    ids = [scheduler.add_request(prompt, params) for prompt in prompts]
    results = {}
    while scheduler.has_unfinished:
        for out in scheduler.step():
            if out.is_final:
                results[out.index] = out.result
    return time.perf_counter() - start, [results[i] for i in ids]


def measure_mode(target, drafter, prompts: list[list[int]], max_new_tokens: int, batch_sizes: list[int],
                 batch1_prompts: int, log: Callable[[str], None] = print, label: str = "") -> dict:
    """{"runs": {"1": {...}, "16": {...}}, "tau": ...} for one decoding mode (drafter None: plain)."""
    limits = SchedulerLimits(max_batch_size=max(batch_sizes + [1]))
    scheduler = Scheduler(target, drafter, limits=limits)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    warmup = SamplingParams(max_new_tokens=min(8, max_new_tokens))
    run_batch(scheduler, prompts[:1], warmup)
    runs, all_results = {}, []
    seconds, tokens = 0.0, []
    for prompt in prompts[:batch1_prompts]:
        elapsed, [result] = run_batch(scheduler, [prompt], params)
        seconds, tokens = seconds + elapsed, tokens + [result.token_ids]
        all_results.append(result)
    runs["1"] = {"seconds": seconds, "token_ids": tokens}
    log(f"ours {label}: batch 1 done ({seconds:.1f} s)")
    for size in batch_sizes:
        run_batch(scheduler, prompts[:size], warmup)
        elapsed, results = run_batch(scheduler, prompts[:size], params)
        runs[str(size)] = {"seconds": elapsed, "token_ids": [r.token_ids for r in results]}
        all_results += results
        log(f"ours {label}: batch {size} done ({elapsed:.1f} s)")
    steps = sum(r.num_verify_steps for r in all_results)
    tau = sum(sum(r.acceptance_lengths) for r in all_results) / steps if steps and drafter is not None else None
    return {"runs": runs, "tau": tau}
