"""GraphedDrafter's static-buffer path (run eagerly here; on CUDA each bucket replays a captured graph): the same
drafts as the plain drafter through batch padding, in-place compaction of finished sequences and the prefill."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter, StaticDraftCache, bucket_for
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


@pytest.fixture(scope="module")
def pair():
    model = make_tiny_target("llama")
    return TargetModel(model), make_tiny_drafter(model.config, block_size=8)


def test_buckets_round_up_to_powers_of_two():
    assert [bucket_for(b) for b in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]
    with pytest.raises(ValueError):
        bucket_for(10_000)


def test_compaction_keeps_addresses_and_moves_the_kept_rows_first(pair):
    _, drafter = pair
    cache = StaticDraftCache(drafter.config, 3, 16, torch.float32, "cpu")
    with torch.inference_mode():  # the buffers are inference tensors
        for i, t in enumerate(cache.k):
            t[:3] = torch.arange(3.0)[:, None, None, None] + 10 * i
    cache.lens = torch.tensor([5, 6, 7])
    addresses = [t.data_ptr() for t in cache.k + cache.v] + [cache.all_lens.data_ptr()]
    cache.select(torch.tensor([2, 0]))
    assert cache.lens.tolist() == [7, 5] and cache.all_lens.tolist() == [7, 5, 0, 0]
    assert cache.k[1][0, 0, 0, 0] == 12 and cache.k[1][1, 0, 0, 0] == 10
    assert [t.data_ptr() for t in cache.k + cache.v] + [cache.all_lens.data_ptr()] == addresses


def test_one_step_equals_the_plain_drafter_with_a_padded_batch(pair):
    _, drafter = pair
    config = drafter.config
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(3, config.block_size, config.hidden_size, generator=g)
    prefill = torch.randn(3, 11, config.num_target_features * config.hidden_size, generator=g)
    step = torch.randn(3, 4, config.num_target_features * config.hidden_size, generator=g)
    graphed = GraphedDrafter(drafter, graphs=False)
    ours, ref = graphed.new_cache(3, 40), drafter.new_cache(3, 40)
    with torch.inference_mode():
        for features, ctx_lens in ((prefill, torch.tensor([11, 9, 4])), (step, torch.tensor([4, 1, 3]))):
            hidden = graphed(embeds, features, ctx_lens, ours)
            expected = drafter(embeds, features, ctx_lens, ref)
            torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)
    assert ours.lens.tolist() == ref.lens.tolist() == [15, 10, 7]
    assert list(ours.steps) == [(4, 8)]  # batch 3 ran in the bucket of 4 (the prefill ran eagerly)
    for mine, theirs in zip(ours.k, ref.k):
        torch.testing.assert_close(mine[:3], theirs, rtol=1e-5, atol=1e-5)


def test_decoding_loop_drafts_the_same_with_finishing_sequences(pair):
    target, drafter = pair
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [3, 3, 4, 5, 6, 7, 8]]
    params = [SamplingParams(max_new_tokens=n) for n in (20, 9, 14)]  # they finish at different steps
    plain = generate(target, drafter, prompts, params)
    graphed = generate(target, GraphedDrafter(drafter, graphs=False), prompts, params)
    assert [r.token_ids for r in graphed] == [r.token_ids for r in plain]
    assert [r.acceptance_lengths for r in graphed] == [r.acceptance_lengths for r in plain]


def _filled(config, lens: list[int], capacity: int, first: float) -> StaticDraftCache:
    """A cache whose row r holds the value first + r in every slot below its length."""
    cache = StaticDraftCache(config, len(lens), capacity, torch.float32, "cpu")
    with torch.inference_mode():  # the buffers are inference tensors
        for t in cache.k + cache.v:
            for row, n in enumerate(lens):
                t[row, :, :n] = first + row
    cache.lens = torch.tensor(lens)
    return cache


def _addresses(cache: StaticDraftCache) -> list[int]:
    return [t.data_ptr() for t in cache.k + cache.v] + [cache.all_lens.data_ptr()]


def test_joiners_fill_spare_rows_in_place_and_only_a_full_bucket_moves_the_buffers(pair):
    _, drafter = pair
    config = drafter.config
    cache = _filled(config, [5, 3, 7], 16, 10.0)  # 3 rows in a bucket of 4
    cache.steps[(4, 8)] = "a step on the current buffers"
    addresses = _addresses(cache)
    cache.concat(_filled(config, [4], 16, 20.0))
    assert _addresses(cache) == addresses and cache.steps  # the spare row took it: nothing moved
    assert cache.lens.tolist() == [5, 3, 7, 4] and cache.k[1][3, 0, :4].eq(20.0).all()
    cache.concat(_filled(config, [2, 6], 24, 30.0))  # 6 rows, and a longer reservation: the bucket of 8
    assert cache.allocated_rows == 8 and cache.capacity == 24 and cache.steps == {}
    assert cache.lens.tolist() == [5, 3, 7, 4, 2, 6] and cache.all_lens[6:].tolist() == [0, 0]
    for t in cache.k + cache.v:
        assert [float(t[row, 0, 0, 0]) for row in range(6)] == [10, 11, 12, 20, 30, 31]
        assert t[2, :, :7].eq(12.0).all() and t[5, :, :6].eq(31.0).all()


def test_leaving_rows_are_compacted_and_memory_no_row_can_use_is_given_back(pair):
    _, drafter = pair
    config = drafter.config
    cache = _filled(config, [5, 3, 7, 4, 2, 6], 24, 10.0)
    addresses = _addresses(cache)
    cache.select(torch.tensor([0, 5, 2, 4]))  # rows 1 and 3 leave; row 5 takes row 1's place
    assert _addresses(cache) == addresses and cache.lens.tolist() == [5, 6, 7, 2]
    assert cache.all_lens[4:].eq(0).all()  # padded rows: no context
    assert [float(cache.k[0][row, 0, 0, 0]) for row in range(4)] == [10, 15, 12, 14]
    cache.steps[(4, 8)] = "a step on the current buffers"
    cache.shrink(24)
    assert _addresses(cache) == addresses and cache.steps  # 8 rows for 4 is within twice the batch
    cache.select(torch.tensor([2, 1]))
    cache.shrink(16)  # 8 rows for 2, capacity past the longest reservation: both given back
    assert cache.allocated_rows == 2 and cache.capacity == 16 and cache.steps == {}
    assert cache.lens.tolist() == [7, 6] and cache.k[1][0, :, :7].eq(12.0).all() and cache.k[1][1, :, :6].eq(15.0).all()
    with pytest.raises(ValueError, match="too small"):
        GraphedDrafter(drafter, graphs=False)(torch.zeros(2, 8, config.hidden_size),
                                              torch.zeros(2, 12, config.num_target_features * config.hidden_size),
                                              torch.tensor([10, 1]), cache)


def test_what_cannot_be_captured_is_named_and_refused_when_graphs_are_asked_for(pair, monkeypatch):
    from dflash_trt.decoding.model.graphs.drafter import capture_blockers
    from dflash_trt.errors import CompatibilityError
    from dflash_trt.testing import tiny_target_config

    wide = make_tiny_drafter(tiny_target_config("llama", hidden_size=256), block_size=8)  # head_dim 64
    assert capture_blockers(wide.config) == []
    assert GraphedDrafter(wide).use_graphs is False  # no CUDA here: the static path runs eagerly
    sliding = make_tiny_drafter(tiny_target_config("llama", hidden_size=256), block_size=8, sliding_window=6)
    assert "windowed attention" in capture_blockers(sliding.config)[0]
    cache = GraphedDrafter(sliding).new_cache(3, 40)
    assert [t.shape[2] for t in cache.k] == [5, 5]  # a sliding layer keeps window - 1 rows, as DraftCache does
    with pytest.raises(CompatibilityError, match="cannot be captured in CUDA graphs: sliding-window"):
        GraphedDrafter(sliding, graphs=True)
    _, narrow = pair
    assert capture_blockers(narrow.config) == ["the CUDA draft-attention kernels cover head_dim (64, 128), not 16"]
    monkeypatch.setenv("DFLASH_DRAFT_ATTENTION", "torch")
    assert "DFLASH_DRAFT_ATTENTION=torch" in capture_blockers(wide.config)[0]
