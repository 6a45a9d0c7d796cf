"""When a newcomer's first token goes out (counted in steps, never timed): the step that finishes its prefill
returns it, that step does not also decode the running batch (prefill and decoding steps alternate while prompts
wait), the running batch still decodes every other step under a stream of arrivals, and prefix hits that fit the
step's token budget are all prefilled in one step. Every request still gets its greedy tokens."""

from __future__ import annotations

from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams

LONG = SamplingParams(max_new_tokens=30)


def tokens_by_request(outputs) -> dict:
    got: dict = {}
    for out in outputs:
        got.setdefault(out.index, []).extend(out.new_token_ids)
    return got


def test_a_newcomers_first_token_comes_from_a_step_that_only_prefills(pair):
    target, drafter, prompts, references = pair
    scheduler = Scheduler(target, drafter, 8)
    scheduler.add_request(prompts[2], LONG, request_id="running")
    tokens: dict = {}

    def step() -> dict:
        got = tokens_by_request(scheduler.step())
        for index, new in got.items():
            tokens.setdefault(index, []).extend(new)
        return got

    assert step() == {"running": references[2][:1]}  # the prefill step: the first token alone, no decoding yet
    step()  # "running" takes its first decoding step (and joins the batch)
    scheduler.add_request(prompts[5], LONG, request_id="newcomer")
    got = step()
    assert list(got) == ["newcomer"] and len(got["newcomer"]) == 1  # prefilled; "running" waited one step
    assert set(step()) == {"running", "newcomer"}  # then both decode, the newcomer on its own first
    while scheduler.has_unfinished:
        step()
    assert tokens == {"running": references[2][:30], "newcomer": references[5][:30]}
    assert scheduler.running is None and scheduler.fresh is None


def test_under_a_stream_of_arrivals_the_running_batch_decodes_every_other_step(pair):
    target, drafter, prompts, references = pair
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(max_batch_size=16))
    scheduler.add_request(prompts[2], SamplingParams(max_new_tokens=30), request_id="running")
    scheduler.step()
    scheduler.step()
    decoded_steps = 0
    for k in range(10):
        scheduler.add_request(prompts[k % len(prompts)], SamplingParams(max_new_tokens=2), request_id=k)
        decoded_steps += "running" in tokens_by_request(scheduler.step())
    assert decoded_steps == 5  # prompts were waiting at every step: one step in two decodes, the other prefills


def test_prefix_hits_within_the_token_budget_are_prefilled_in_one_step(pair):
    target, drafter, prompts, references = pair
    cache = PrefixCache(max_bytes=1 << 30, block_tokens=8)
    scheduler = Scheduler(target, drafter, 8, SchedulerLimits(prefill_chunk_tokens=64), prefix_cache=cache)
    owner = prompts[2] + prompts[8]  # 73 tokens: 9 cached blocks of 8 once it is prefilled
    scheduler.add_request(owner, SamplingParams(max_new_tokens=1), request_id="owner")
    while scheduler.has_unfinished:
        scheduler.step()
    suffixes = [prompts[0], prompts[1], prompts[4]]  # 1, 3 and 2 tokens after the shared 72
    for k, suffix in enumerate(suffixes):
        scheduler.add_request(owner[:72] + suffix, SamplingParams(max_new_tokens=4), request_id=k)
    outputs = scheduler.step()
    assert sorted(out.index for out in outputs) == [0, 1, 2]  # three hits prefilled in one step
    assert [out.num_cached_tokens for out in sorted(outputs, key=lambda o: o.index)] == [72, 72, 72]
    assert all(len(out.new_token_ids) == 1 for out in outputs)
