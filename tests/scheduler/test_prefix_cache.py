"""The prefix cache (scheduler/prefix_cache.py): a request that reuses cached prompt blocks gets exactly what it
gets without the cache: the same tokens, the same acceptance lengths and the same drafts at every step (the
drafter's context is the full prefill's), for Llama (also at GGUF precision, where a request alone is prefilled
by the native decoder), sliding-window Qwen3 and gpt-oss targets with DFlash, DFlash2 and sliding-window drafters;
whole and partial block chains, a hit while the blocks' owner still runs, a multi-turn prompt that extends an earlier
one; eviction keeps the cache within its bytes; a stale block breaks it.
"""

from __future__ import annotations

import pytest
import torch
from joining_run import context_sensitive

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.drafters import load_drafter
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache, PrefixHit
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step import step as decoding
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, tiny_gguf_target

BLOCK = 8
BLOCK_TOKENS = 16
MAX_NEW = 20
ARRIVALS = {0: [0], 2: [1], 4: [2], 6: [3], 7: [4]}  # step -> requests arriving before it


def family_target(family: str) -> TargetModel:
    if family == "llama-gguf":  # at GGUF precision: prefills run by the native decoder
        return tiny_gguf_target(seed=4)
    if family == "qwen3-sliding":
        return TargetModel(make_tiny_target("qwen3", seed=4, use_sliding_window=True, sliding_window=6,
                                            layer_types=["sliding_attention", "full_attention"] * 3))
    return TargetModel(make_tiny_target(family, seed=4))


def make_prompts(target: TargetModel) -> list[list[int]]:
    """A 37-token system prompt shared by requests 0, 1 and 4; request 2 shares its first 30 tokens (one whole
    block); request 3 is request 0's second turn (its prompt, its greedy answer, a new question)."""
    g = torch.Generator().manual_seed(7)
    system = torch.randint(0, 250, (37,), generator=g).tolist()
    tails = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (5, 9, 4, 6, 1)]
    first = system + tails[0]
    answer = generate(target, None, [first], SamplingParams(max_new_tokens=MAX_NEW), block_size=1)[0].token_ids
    return [first, system + tails[1], system[:30] + tails[2], first + answer + tails[3], system + tails[4]]


def record_drafts(monkeypatch) -> dict:
    """Every row's drafts of every step, by request id, from now until monkeypatch.undo()."""
    drafts: dict = {}
    original = decoding.draft_block

    def recording_draft_block(target, drafter, batch, block_size, block_lens=None, top_k=0):
        block, proposal = original(target, drafter, batch, block_size, block_lens, top_k)
        for row, request in enumerate(batch.requests):
            drafts.setdefault(request.request_id, []).append(block[row, 1:].tolist())
        return block, proposal

    monkeypatch.setattr(decoding, "draft_block", recording_draft_block)
    return drafts


def run(target, drafter, prompts, cache: PrefixCache | None, monkeypatch, after_step=None, chunk=None) -> dict:
    """Drive a scheduler through ARRIVALS; per request: tokens, acceptance lengths, every step's drafts and the
    cached token count. Without chunking (chunk None) every prefill takes one step, hit or not, so both runs
    batch the same rows at every step and even the drafts must agree to the bit; with chunked prefill a hit
    finishes its prefill sooner and the batches differ, which leaves tokens exact but may flip a near-tie draft."""
    drafts = record_drafts(monkeypatch)
    scheduler = Scheduler(target, drafter, BLOCK, SchedulerLimits(max_batch_size=4, prefill_chunk_tokens=chunk),
                          FixedBlockSize(BLOCK), prefix_cache=cache)
    results, cached, step = {}, {}, 0
    while step <= max(ARRIVALS) or scheduler.has_unfinished:
        for i in ARRIVALS.get(step, []):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=MAX_NEW), request_id=i)
        for out in scheduler.step():
            cached.setdefault(out.index, out.num_cached_tokens)
            if out.is_final:
                results[out.index] = out.result
        if after_step is not None:
            after_step(scheduler)
        step += 1
        assert step < 300, "the scheduler does not finish"
    monkeypatch.undo()
    return {"tokens": {i: r.token_ids for i, r in results.items()},
            "acceptance": {i: r.acceptance_lengths for i, r in results.items()},
            "drafts": drafts, "cached": cached,
            "result_cached": {i: r.num_cached_tokens for i, r in results.items()}}


def drafter_for(target, kind: str, tmp_path):
    settings = {"dflash": {}, "dflash2": {"family": "dflash2"}, "sliding": {"sliding_window": 4}}[kind]
    make_tiny_drafter(target.config, directory=tmp_path / kind, block_size=BLOCK, **settings)
    drafter = load_drafter(tmp_path / kind)
    return context_sensitive(drafter) if kind != "dflash2" else drafter


@pytest.fixture(scope="module", params=["llama", "llama-gguf", "qwen3-sliding", "gpt_oss"])
def family(request):
    target = family_target(request.param)
    return target, make_prompts(target)


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "sliding"])
def test_a_cache_hit_gives_the_same_tokens_acceptance_and_drafts(family, kind, tmp_path, monkeypatch):
    target, prompts = family
    drafter = drafter_for(target, kind, tmp_path)
    without = run(target, drafter, prompts, None, monkeypatch)
    cache = PrefixCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS)
    with_cache = run(target, drafter, prompts, cache, monkeypatch)
    for key in ("tokens", "acceptance", "drafts"):
        assert with_cache[key] == without[key], key
    # 0 fills the cache; 1 and 4 reuse its two whole system blocks (1 while 0 still runs), 2 one block (a
    # partial chain), 3 (the second turn) every whole block of 0's prompt it starts with.
    assert with_cache["cached"] == {0: 0, 1: 32, 2: 16, 3: 32, 4: 32}
    assert with_cache["result_cached"] == with_cache["cached"] and set(without["cached"].values()) == {0}
    assert cache.hits_tokens == 112 and cache.queries_tokens == sum(len(p) for p in prompts)


def test_chunked_prefill_with_hits_gives_the_same_tokens(family, tmp_path, monkeypatch):
    target, prompts = family
    drafter = drafter_for(target, "dflash", tmp_path)
    without = run(target, drafter, prompts, None, monkeypatch, chunk=24)
    cache = PrefixCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS)
    chunked = run(target, drafter, prompts, cache, monkeypatch, chunk=24)
    assert chunked["tokens"] == without["tokens"]
    assert chunked["cached"] == {0: 0, 1: 32, 2: 16, 3: 32, 4: 32}


def test_eviction_keeps_the_cache_within_its_bytes_and_the_output_exact(family, tmp_path, monkeypatch):
    target, prompts = family
    drafter = drafter_for(target, "dflash", tmp_path)
    without = run(target, drafter, prompts, None, monkeypatch)
    probe = PrefixCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS)
    run(target, drafter, prompts, probe, monkeypatch)
    block_kv_bytes = probe.kv_bytes // len(probe.blocks)
    assert probe.bytes > probe.kv_bytes  # the drafter's features are held too, beside the budgeted KV
    cache = PrefixCache(max_bytes=3 * block_kv_bytes, block_tokens=BLOCK_TOKENS)  # room for 3 blocks' KV

    def within_budget(scheduler):
        assert cache.kv_bytes <= cache.max_bytes and len(cache.blocks) <= 3

    evicting = run(target, drafter, prompts, cache, monkeypatch, after_step=within_budget)
    for key in ("tokens", "acceptance", "drafts"):
        assert evicting[key] == without[key], key
    assert cache.hits_tokens > 0 and len(probe.blocks) > 3  # hits survived; more blocks were stored than fit


def test_a_stale_block_changes_the_output(family, tmp_path, monkeypatch):
    """Broken on purpose: a cache that matches blocks by position only (ignoring their tokens) reuses the system
    prompt's blocks for a prompt that differs there; the test above would see the difference."""
    target, prompts = family
    drafter = drafter_for(target, "dflash", tmp_path)
    changed = list(prompts)
    changed[1] = [(t + 1) % 250 for t in prompts[1][:20]] + prompts[1][20:]  # differs inside both blocks
    without = run(target, drafter, changed, None, monkeypatch)

    class StaleCache(PrefixCache):
        def match(self, prompt):
            blocks = list(self.blocks.values())[:(len(prompt) - 1) // self.block_tokens]
            ordered = sorted(blocks, key=lambda b: b.parent is not None)
            return PrefixHit(ordered[:2])

    stale = run(target, drafter, changed, StaleCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS), monkeypatch)
    assert stale["tokens"][1] != without["tokens"][1] or stale["drafts"][1] != without["drafts"][1]


def test_block_keys_chain_and_bad_settings_are_refused():
    cache = PrefixCache(max_bytes=1 << 20, block_tokens=4)
    a = cache.chain_keys([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = cache.chain_keys([0, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2 and len(b) == 2  # full blocks only
    assert a[1][1] == b[1][1] and a[1][0] != b[1][0]  # same tokens, other prefix: another key
    with pytest.raises(DFlashError, match="max_bytes must be >= 1"):
        PrefixCache(max_bytes=0)
    with pytest.raises(DFlashError, match="block_tokens must be >= 1"):
        PrefixCache(max_bytes=10, block_tokens=0)


def test_the_static_verify_cache_takes_hits_too(tmp_path, monkeypatch):
    """GraphedVerifier's static cache (what CUDA graphs replay; eager on CPU): the hit's blocks enter the prefill
    and the static cache takes them over like any prefill's."""
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier

    target = family_target("llama")
    prompts = make_prompts(target)
    verifier = GraphedVerifier(target, graphs=False)
    drafter = drafter_for(target, "dflash", tmp_path)
    without = run(verifier, drafter, prompts, None, monkeypatch)
    with_cache = run(verifier, drafter, prompts, PrefixCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS),
                     monkeypatch)
    for key in ("tokens", "acceptance", "drafts"):
        assert with_cache[key] == without[key], key
    assert with_cache["cached"] == {0: 0, 1: 32, 2: 16, 3: 32, 4: 32}


def test_under_load_a_small_hit_joins_the_group_and_a_large_one_is_prefilled_alone(tmp_path, monkeypatch):
    """A hit is prefilled alone; while other requests wait, a hit below half of its prompt would cost a prefill
    step of its own for little, so it is left unused and the request joins the group (tokens unchanged)."""
    target = family_target("llama")
    prompts = make_prompts(target)
    drafter = drafter_for(target, "dflash", tmp_path)
    cache = PrefixCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS)
    scheduler = Scheduler(target, drafter, BLOCK, SchedulerLimits(max_batch_size=4), FixedBlockSize(BLOCK),
                          prefix_cache=cache)
    scheduler.add_request(prompts[0], SamplingParams(max_new_tokens=4), request_id="owner")
    while scheduler.has_unfinished:
        scheduler.step()
    g = torch.Generator().manual_seed(3)
    small = prompts[0][:16] + torch.randint(0, 250, (30,), generator=g).tolist()  # 16 of 46 tokens cached
    large = prompts[0][:32] + [5, 6]  # 32 of 34 tokens cached
    other = torch.randint(0, 250, (12,), generator=g).tolist()
    for name, prompt in (("small", small), ("other", other), ("large", large)):
        scheduler.add_request(prompt, SamplingParams(max_new_tokens=4), request_id=name)
    import dflash_trt.decoding.scheduler.scheduler as scheduler_module

    groups, job = [], scheduler_module.PrefillJob

    def recording_job(target, drafter, requests, layer_ids, hit=None):
        groups.append(sorted(r.request_id for r in requests))
        return job(target, drafter, requests, layer_ids, hit)

    monkeypatch.setattr(scheduler_module, "PrefillJob", recording_job)
    cached = {}
    while scheduler.has_unfinished:
        for out in scheduler.step():
            cached.setdefault(out.index, out.num_cached_tokens)
    assert cached == {"small": 0, "other": 0, "large": 32}
    assert ["large"] in groups and ["other", "small"] in groups
    assert cache.hits_tokens == 32 and cache.queries_tokens == len(prompts[0]) + len(small) + len(other) + len(large)


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_finished_answer_is_cached_for_the_next_turn(family, kind, tmp_path, monkeypatch):
    """Turn 1 finishes; turn 2 (turn 1's prompt, its answer, a new question) then reuses the answer's blocks too,
    with the tokens, acceptance and drafts it gets without the cache."""
    target, prompts = family
    drafter = drafter_for(target, kind, tmp_path)
    first, second = prompts[0], prompts[3]  # second = first + its greedy answer + a new question

    def two_turns(cache):
        drafts = record_drafts(monkeypatch)
        scheduler = Scheduler(target, drafter, BLOCK, SchedulerLimits(max_batch_size=2), FixedBlockSize(BLOCK),
                              prefix_cache=cache)
        results = {}
        for turn, prompt in enumerate((first, second)):
            scheduler.add_request(prompt, SamplingParams(max_new_tokens=MAX_NEW), request_id=turn)
            while scheduler.has_unfinished:
                for out in scheduler.step():
                    if out.is_final:
                        results[turn] = out.result
        monkeypatch.undo()
        return results, drafts

    without, drafts_without = two_turns(None)
    cache = PrefixCache(max_bytes=1 << 30, block_tokens=BLOCK_TOKENS)
    with_cache, drafts_with = two_turns(cache)
    assert [r.token_ids for r in with_cache.values()] == [r.token_ids for r in without.values()]
    assert [r.acceptance_lengths for r in with_cache.values()] == [r.acceptance_lengths for r in without.values()]
    assert drafts_with == drafts_without
    answered = len(first) + MAX_NEW - 1  # turn 1's positions with KV: its prompt and all but its last token
    assert with_cache[1].num_cached_tokens == answered // BLOCK_TOKENS * BLOCK_TOKENS > len(first)
