"""The greedy section's in-flight case: requests joining and leaving a running batch through the scheduler, with
the verify and the draft steps both graphed (GraphedVerifier, GraphedDrafter), whose tokens must be transformers'
greedy ones. On CUDA the run must also have replayed captured graphs of both parts; on CPU both static paths run
eagerly."""

from __future__ import annotations

from typing import Sequence

ARRIVAL_EVERY = 2  # scheduler steps between two arrivals
BUDGET_STEP = 6  # request i generates new_tokens - BUDGET_STEP * (i % 3): requests leave at different steps


def budgets(num_prompts: int, new_tokens: int) -> list[int]:
    return [max(1, new_tokens - BUDGET_STEP * (i % 3)) for i in range(num_prompts)]


def join_and_leave(target, drafter, prompts: Sequence[Sequence[int]], new_tokens: int, block_size: int
                   ) -> tuple[dict[int, list[int]], dict[str, int]]:
    """Every prompt's tokens (budgets()) when they arrive ARRIVAL_EVERY steps apart, the longest reservation
    first (so that later ones join the spare rows of the buffers the first one sized), and what ran: the most rows
    decoding together and the most draft and verify steps of the running batch replaying a graph."""
    from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
    from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
    from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
    from dflash_trt.decoding.step.sampling import SamplingParams

    limits = SchedulerLimits(max_batch_size=len(prompts), max_kv_tokens=None, prefill_chunk_tokens=None)
    scheduler = Scheduler(GraphedVerifier(target), GraphedDrafter(drafter), block_size, limits,
                          FixedBlockSize(block_size))
    budget = budgets(len(prompts), new_tokens)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + budget[i], reverse=True)
    tokens: dict[int, list[int]] = {}
    stats = {"max_rows": 0, "draft_graphs": 0, "verify_graphs": 0}
    step = 0
    while step <= ARRIVAL_EVERY * (len(order) - 1) or scheduler.has_unfinished:
        if step % ARRIVAL_EVERY == 0 and step // ARRIVAL_EVERY < len(order):
            i = order[step // ARRIVAL_EVERY]
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=budget[i]), request_id=i)
        for out in scheduler.step():
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
        running = scheduler.running
        if running is not None:
            stats["max_rows"] = max(stats["max_rows"], len(running))
            stats["draft_graphs"] = max(stats["draft_graphs"], _graphs(running.draft_cache.steps))
            stats["verify_graphs"] = max(stats["verify_graphs"], _graphs(running.cache.forwards))
        step += 1
        if step > 100 * (new_tokens + len(prompts)):
            raise RuntimeError("the scheduler does not finish")  # a bug, reported as the section's error
    return tokens, stats


def _graphs(steps: dict) -> int:
    return sum(step.graph is not None for step in steps.values())
