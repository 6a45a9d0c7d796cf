"""In-flight batching gives every request exactly the tokens it gets alone, whenever it joins."""

from __future__ import annotations

import pytest
from conftest import MAX_NEW_TOKENS, oracle_for

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams


def run_arrivals(scheduler, arrivals: dict[int, list[tuple[int, list[int], SamplingParams]]]):
    """Drive the scheduler; arrivals[step] = requests added before that step. Returns tokens per id and
    the number of running rows at each step."""
    tokens, finish, running, step = {}, {}, [], 0
    while step <= max(arrivals) or scheduler.has_unfinished:
        for request_id, prompt, params in arrivals.get(step, []):
            scheduler.add_request(prompt, params, request_id=request_id)
        for out in scheduler.step():
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
            if out.is_final:
                finish[out.index] = out.result.finish_reason
                assert out.result.token_ids == tokens[out.index]
        running.append(scheduler.num_running)
        step += 1
        assert step < 2000, "the scheduler does not finish"
    return tokens, finish, running


def staggered(prompts, params_for, every: int = 2):
    """Request i arrives before step every * i (two at once for even i past 4)."""
    arrivals: dict[int, list] = {}
    for i, prompt in enumerate(prompts):
        arrivals.setdefault(every * i - (i > 4 and i % 2 == 0), []).append((i, prompt, params_for(i)))
    return arrivals


def _params(i: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=5 + (7 * i) % (MAX_NEW_TOKENS - 5))


@pytest.mark.parametrize("block_size, drafter_kind, chunk", [(1, None, 512), (4, "oracle", 16), (8, "oracle", 8),
                                                              (8, "random", 16)])
def test_greedy_requests_joining_at_different_steps_get_their_alone_tokens(pair, block_size, drafter_kind, chunk):
    target, drafter, prompts, references = pair
    if drafter_kind == "oracle":
        drafter = oracle_for(pair, block_size, list(range(len(prompts))))
    scheduler = Scheduler(target, drafter if drafter_kind else None, block_size,
                          SchedulerLimits(max_batch_size=6, prefill_chunk_tokens=chunk), FixedBlockSize(block_size))
    tokens, finish, running = run_arrivals(scheduler, staggered(prompts, _params))
    assert max(running) >= 3, "requests should overlap in the running batch"
    for i in range(len(prompts)):
        assert tokens[i] == references[i][:_params(i).max_new_tokens], f"request {i}"
        assert finish[i] == "length"
    assert scheduler.running is None and scheduler.prefill is None and not scheduler.waiting


def test_oracle_drives_long_acceptance_in_the_joined_batch(pair):
    target, _drafter, prompts, references = pair
    drafter = oracle_for(pair, 8, list(range(len(prompts))))
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_batch_size=12), FixedBlockSize(8))
    lengths = []
    arrivals = staggered(prompts, lambda i: SamplingParams(max_new_tokens=MAX_NEW_TOKENS))
    step = 0
    while step <= max(arrivals) or scheduler.has_unfinished:
        for request_id, prompt, params in arrivals.get(step, []):
            scheduler.add_request(prompt, params, request_id=request_id)
        lengths += [out.acceptance_length for out in scheduler.step() if out.acceptance_length]
        step += 1
    assert max(lengths) == 8 and len(set(lengths)) >= 5  # long and ragged acceptance


def test_stop_token_and_max_tokens_end_each_request_alone(pair):
    target, drafter, prompts, references = pair
    oracle = oracle_for(pair, 4, list(range(len(prompts))))

    def params_for(i):
        stop = (references[i][6],) if i % 3 == 0 else ()
        return SamplingParams(max_new_tokens=1 + i * 2, stop_token_ids=stop)

    scheduler = Scheduler(target, oracle, 4, SchedulerLimits(max_batch_size=4, prefill_chunk_tokens=10),
                          FixedBlockSize(4))
    tokens, finish, _ = run_arrivals(scheduler, staggered(prompts, params_for, every=1))
    for i in range(len(prompts)):
        alone = generate(target, None, [prompts[i]], params_for(i), block_size=1)[0]
        assert tokens[i] == alone.token_ids and finish[i] == alone.finish_reason, f"request {i}"


@pytest.mark.parametrize("filters", [dict(temperature=1.0), dict(temperature=0.7, top_k=20, top_p=0.9)])
def test_seeded_sampled_requests_emit_the_same_tokens_in_any_batch_and_block_size(pair, filters):
    target, drafter, prompts, _references = pair

    def params_for(i):
        return SamplingParams(max_new_tokens=20, seed=100 + i, **filters)

    alone = [generate(target, None, [p], params_for(i), block_size=1)[0].token_ids for i, p in enumerate(prompts)]
    assert len({tuple(a) for a in alone}) == len(prompts)
    for block_size in (1, 4, 8):
        scheduler = Scheduler(target, drafter if block_size > 1 else None, block_size,
                              SchedulerLimits(max_batch_size=5, prefill_chunk_tokens=16), FixedBlockSize(block_size))
        tokens, _, running = run_arrivals(scheduler, staggered(prompts, params_for))
        assert max(running) >= 3
        for i in range(len(prompts)):
            assert tokens[i] == alone[i], f"block {block_size} request {i}"


def test_unseeded_sampled_requests_differ(pair):
    target, _drafter, prompts, _ = pair
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    first, second = (generate(target, None, [prompts[2]] * 2, params, block_size=1) for _ in range(2))
    assert len({tuple(r.token_ids) for r in first + second}) > 1
