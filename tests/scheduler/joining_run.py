"""Driving the in-flight scheduler through arrivals, an abort and cycling block sizes, recording every request's
tokens and drafts (test_graphed_drafter_joining.py, and its GPU twin)."""

from __future__ import annotations

import torch
from conftest import MAX_NEW_TOKENS

from dflash_trt.decoding.model.graphs.drafter import StaticDraftCache
from dflash_trt.decoding.scheduler.block_policy import StepPlan
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step import step as decoding
from dflash_trt.decoding.step.sampling import SamplingParams

ORDER = [2, 0, 5, 1, 8, 3, 7, 4]  # prompts (of conftest's) in arrival order: lengths 40, 1, 25, 3, 33, 7, 5, 2
ARRIVALS = {0: ORDER[:2], 3: ORDER[2:3], 5: ORDER[3:5], 9: ORDER[5:6], 12: ORDER[6:8]}  # step -> arriving prompts
ABORT = (17, 3)  # before this step, abort this prompt's request (mid-decode)
BLOCK_SIZES = (8, 8, 5, 1, 8, 3, 8, 2, 1, 1, 8, 6)  # the policy's choices, in turn: widths < 8, plain steps
VALUE_SCALE = 20.0  # context_sensitive's factor


def budget(i: int) -> int:
    return MAX_NEW_TOKENS - 4 * (i % 5)


class CyclingBlockSize:
    """A block-size policy that takes BLOCK_SIZES in turn (deterministic, unlike the adaptive one's timings)."""

    max_block_size = 8
    tree_budgets: list[int] = []

    def __init__(self):
        self.calls = 0

    def choose(self, batch_size: int, **_) -> StepPlan:
        self.calls += 1
        return StepPlan(BLOCK_SIZES[(self.calls - 1) % len(BLOCK_SIZES)])

    def observe(self, *args) -> None:
        pass

    def observe_catch_up(self, rows, seconds) -> None:
        pass

    def observe_overhead(self, batch_size, seconds) -> None:
        pass


def oracle_block(references: dict[int, list[int]], drafts: dict[int, list[list[int]]], vocab: int):
    """decoding.draft_block that records every row's drafts (its real slots) by request and then puts the
    request's reference tokens in the block, every fifth one (by a hash of the position) off by one."""
    original = decoding.draft_block

    @torch.inference_mode()
    def draft_block(target, drafter, batch, block_size, block_lens=None, top_k=0):
        block, proposal = original(target, drafter, batch, block_size, block_lens, top_k)
        lens = block_lens.tolist() if block_lens is not None else [block_size] * len(batch)
        for row, request in enumerate(batch.requests):
            drafts.setdefault(request.request_id, []).append(block[row, 1:lens[row]].tolist())
            full, start = references[request.request_id], int(batch.next_pos[row])
            for k in range(1, block_size):
                position = start + k
                token = full[position] if position < len(full) else 0
                if (((position * 2654435761 + request.request_id * 40503) & 0xFFFFFFFF) >> 16) % 5 == 0:
                    token = (token + 1) % vocab
                block[row, k] = token
        proposal.drafts = block[:, 1:].clone()
        return block, proposal

    return draft_block


def run_joining(pair, target, drafter, monkeypatch) -> dict:
    """Drive the scheduler through ARRIVALS and ABORT: tokens, acceptance lengths and drafts per request, and
    what the running batch's draft cache looked like after each step: (rows, allocated rows, its draft steps'
    keys, its buffers' addresses, how many of its steps hold a captured graph)."""
    _, _, prompts, references = pair
    drafts: dict[int, list[list[int]]] = {}
    full = {i: prompts[i] + references[i] for i in ORDER}
    monkeypatch.setattr(decoding, "draft_block", oracle_block(full, drafts, target.vocab_size))
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_batch_size=5, prefill_chunk_tokens=24),
                          CyclingBlockSize())
    tokens, acceptance, finish, caches, step = {}, {}, {}, [], 0
    while step <= max(ARRIVALS) or scheduler.has_unfinished:
        for i in ARRIVALS.get(step, []):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=budget(i)), request_id=i)
        if step == ABORT[0]:
            assert scheduler.abort(ABORT[1])
        for out in scheduler.step():
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
            if out.is_final:
                finish[out.index] = out.result.finish_reason
                acceptance[out.index] = out.result.acceptance_lengths
        running = scheduler.running
        if running is not None and isinstance(running.draft_cache, StaticDraftCache):
            cache = running.draft_cache
            caches.append((len(running), cache.allocated_rows, tuple(sorted(cache.steps)),
                           [t.data_ptr() for t in cache.k], sum(s.graph is not None for s in cache.steps.values())))
        step += 1
        assert step < 400, "the scheduler does not finish"
    monkeypatch.undo()
    return {"tokens": tokens, "acceptance": acceptance, "finish": finish, "drafts": drafts, "caches": caches}


def context_sensitive(drafter):
    """The drafter with its value projections scaled up: the context's values outweigh the block's own embeddings,
    so a draft follows the context it is given (a random drafter's drafts barely do)."""
    with torch.no_grad():
        for layer in drafter.layers:
            layer.self_attn.v_proj.weight.mul_(VALUE_SCALE)
    return drafter
