"""Aborts leave within one step; batch and KV limits hold under any load; long prompts prefill in chunks."""

from __future__ import annotations

import pytest
from conftest import oracle_for

from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.errors import DFlashError


def _collect(outputs, tokens, finals):
    for out in outputs:
        tokens.setdefault(out.index, []).extend(out.new_token_ids)
        if out.is_final:
            finals[out.index] = out.result.finish_reason


def test_aborted_request_leaves_within_one_step_and_the_others_are_unchanged(pair):
    target, _drafter, prompts, references = pair
    drafter = oracle_for(pair, 4, [0, 1, 2, 3])
    scheduler = Scheduler(target, drafter, 4, SchedulerLimits(max_batch_size=4), FixedBlockSize(4))
    params = SamplingParams(max_new_tokens=30)
    for i in range(4):
        scheduler.add_request(prompts[i], params, request_id=i)
    tokens, finals = {}, {}
    while scheduler.num_running < 4:
        _collect(scheduler.step(), tokens, finals)
    assert scheduler.abort(2) and not scheduler.abort(2)
    outputs = scheduler.step()
    _collect(outputs, tokens, finals)
    assert finals == {2: "cancelled"} and scheduler.num_running == 3
    assert 2 not in {r.request_id for r in scheduler.running.requests}
    assert not any(out.index == 2 and out.new_token_ids for out in outputs)
    while scheduler.has_unfinished:
        _collect(scheduler.step(), tokens, finals)
    for i in (0, 1, 3):
        assert tokens[i] == references[i][:30] and finals[i] == "length"
    assert tokens[2] == references[2][:len(tokens[2])] and len(tokens[2]) < 30


def test_abort_of_a_waiting_request_never_runs_it(pair):
    target, drafter, prompts, _ = pair
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_batch_size=1), FixedBlockSize(8))
    scheduler.add_request(prompts[0], SamplingParams(max_new_tokens=5), request_id="a")
    scheduler.add_request(prompts[1], SamplingParams(max_new_tokens=5), request_id="b")
    scheduler.step()
    assert scheduler.abort("b")
    seen = []
    while scheduler.has_unfinished:
        seen += [(out.index, out.is_final, len(out.new_token_ids)) for out in scheduler.step()]
    assert ("b", True, 0) in seen and not any(i == "b" and n for i, _f, n in seen)


@pytest.mark.parametrize("max_batch, max_kv", [(3, None), (16, 160)])
def test_running_batch_stays_within_its_limits(pair, max_batch, max_kv):
    target, drafter, prompts, _ = pair
    limits = SchedulerLimits(max_batch_size=max_batch, max_kv_tokens=max_kv, prefill_chunk_tokens=32)
    scheduler = Scheduler(target, drafter, 8, limits, FixedBlockSize(8))
    for i, prompt in enumerate(prompts * 2):  # everything arrives at once
        scheduler.add_request(prompt[:20], SamplingParams(max_new_tokens=12), request_id=i)
    peak, finished = 0, 0
    while scheduler.has_unfinished:
        finished += sum(out.is_final for out in scheduler.step())
        rows = scheduler.running.requests if scheduler.running else []
        peak = max(peak, len(rows))
        assert len(rows) <= max_batch
        if rows and max_kv is not None:
            assert len(rows) * max(r.reserved_tokens for r in rows) <= max_kv
            assert scheduler.running.width <= max(r.reserved_tokens for r in rows)
    assert finished == 2 * len(prompts) and peak >= 3
    # (the drafter's capacity is trimmed when it drafts: the next test)


def test_a_batch_decoding_plain_leaves_the_drafters_buffers_alone_until_it_drafts_again(pair):
    """Rows that leave a batch decoding plain do not shrink the drafter's context cache (newcomers would grow it
    again: a reallocation per request on a loaded server); the next draft call gives back what no row can reach."""
    target, drafter, prompts, _ = pair
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_batch_size=4, prefill_chunk_tokens=None),
                          FixedBlockSize(8))
    for i, length in enumerate([30, 60, 60, 60]):
        scheduler.add_request(prompts[i][:20], SamplingParams(max_new_tokens=length), request_id=i)
    while scheduler.num_running < 4:
        scheduler.step()
    scheduler.step()  # a drafted step of the four rows: the drafter's buffers are allocated
    batch = scheduler.running
    buffer, capacity = batch.draft_cache._k[0], batch.draft_cache.capacity
    scheduler.policy = FixedBlockSize(1)
    for i in (1, 2, 3):  # the rows of the longest reservations leave, one per plain step
        scheduler.abort(i)
        scheduler.step()
    assert len(batch) == 1 and batch.draft_cache._k[0] is buffer and batch.draft_cache.capacity == capacity
    scheduler.policy = FixedBlockSize(8)
    scheduler.step()
    assert batch.draft_cache.capacity == batch.requests[0].reserved_tokens < capacity


def test_is_full_holds_new_requests_back(pair):
    target, drafter, prompts, _ = pair
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_batch_size=2), FixedBlockSize(8))
    scheduler.add_request(prompts[0], SamplingParams(max_new_tokens=3))
    assert not scheduler.is_full
    scheduler.add_request(prompts[1], SamplingParams(max_new_tokens=3))
    assert scheduler.is_full
    while scheduler.has_unfinished:
        scheduler.step()
    assert not scheduler.is_full and scheduler.num_requests == 0


def test_request_larger_than_the_kv_budget_is_refused_alone(pair):
    target, drafter, prompts, _ = pair
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_kv_tokens=50), FixedBlockSize(8))
    with pytest.raises(DFlashError, match="exceed max_kv_tokens 50"):
        scheduler.add_request(prompts[2], SamplingParams(max_new_tokens=30))
    with pytest.raises(DFlashError, match="empty"):
        scheduler.add_request([], SamplingParams())
    assert scheduler.num_requests == 0


def test_long_prompt_prefills_in_bounded_chunks_while_others_keep_streaming(pair):
    target, drafter, prompts, references = pair
    scheduler = Scheduler(target, drafter, 4, SchedulerLimits(prefill_chunk_tokens=8), FixedBlockSize(4))
    scheduler.add_request(prompts[0], SamplingParams(max_new_tokens=30), request_id="short")
    while scheduler.num_running == 0:
        scheduler.step()
    calls = []
    forward = target.forward

    def spy(token_ids, *args, **kwargs):
        calls.append((tuple(token_ids.shape), kwargs.get("last_only", False)))
        return forward(token_ids, *args, **kwargs)

    target.forward = spy
    try:
        scheduler.add_request(prompts[2], SamplingParams(max_new_tokens=4), request_id="long")  # 40 tokens
        streamed = 0
        while scheduler.num_running < 2 and scheduler.has_unfinished:
            calls.clear()
            outputs = scheduler.step()
            streamed += any(out.index == "short" and out.new_token_ids for out in outputs)
            prefill_tokens = sum(rows * cols for (rows, cols), last_only in calls if last_only)
            assert prefill_tokens <= 8
    finally:
        target.forward = forward
    assert streamed >= 40 // 8 - 1  # the short request committed tokens during the long one's prefill


def test_a_drafter_exported_for_one_block_size_only_drafts_that_size(pair):
    from dflash_trt.decoding.scheduler.block_policy import AdaptiveBlockSize
    from dflash_trt.decoding.scheduler.scheduler import allowed_block_sizes

    target, drafter, prompts, references = pair
    static = oracle_for(pair, 8, [0, 1, 2])
    static.static_block_size = 8  # what an ONNX or TensorRT drafter reports
    shapes = []
    propose = static.propose
    static.propose = lambda t, block, *rest, **kw: shapes.append(block.shape[1]) or propose(t, block, *rest, **kw)
    assert allowed_block_sizes(static, 8) == [1, 8]
    with pytest.raises(DFlashError, match="exported for block size 8"):
        allowed_block_sizes(static, 4)
    scheduler = Scheduler(target, static, 8, SchedulerLimits(max_batch_size=3))
    assert isinstance(scheduler.policy, AdaptiveBlockSize) and scheduler.policy.sizes == [1, 8]
    tokens, finals = {}, {}
    for i in range(3):
        scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=11), request_id=i)
    while scheduler.has_unfinished:
        _collect(scheduler.step(), tokens, finals)
    # The policy picks only the exported size; only the last blocks shrink to the tokens left (the exported
    # graph's block length is dynamic up to its size), and a shrunk block is followed by no full one.
    first_short = next((i for i, width in enumerate(shapes) if width < 8), len(shapes))
    assert first_short > 0 and set(shapes[:first_short]) == {8} and all(w < 8 for w in shapes[first_short:])
    for i in range(3):
        assert tokens[i] == references[i][:11]
