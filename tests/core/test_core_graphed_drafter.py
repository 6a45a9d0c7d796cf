"""GraphedDrafter's static-buffer path (run eagerly here; on CUDA each bucket replays a captured graph): the same
drafts as the plain drafter through batch padding, in-place compaction of finished sequences and the prefill."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding import generate
from dflash_trt.graphed_drafter import GraphedDrafter, StaticDraftCache, bucket_for
from dflash_trt.sampling import SamplingParams
from dflash_trt.target import TargetModel
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
    assert 4 in ours.graphs  # batch 3 ran in the bucket of 4
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
