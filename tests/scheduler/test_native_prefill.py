"""Prefill on a target with the native decoder (scheduler/prefill.py, model/lean_llama.py): right-padded prompts
over a decoding cache from the start, alone or as a ragged group, whole or in chunks, from a prefix hit or not, give
the logits, keys, values, features and first tokens of transformers' forward over a left-padded cache, bit for bit.
(The prefix-cache tests run such a target too, and the quantized targets' greedy tests compare its DFlash output with
plain decoding.)"""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.prefill import PrefillJob
from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache
from dflash_trt.decoding.step.batch import Request
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import tiny_gguf_target

FEATURE_LAYERS = [0, 1]


@pytest.fixture(scope="module")
def targets():
    """(the target with the native decoder, the same model through transformers' forward alone)."""
    native = tiny_gguf_target(seed=3)
    padded = TargetModel(native.model)
    padded.use_rowwise_attention()
    assert padded.lean is None
    return native, padded


def prompt(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 250, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill(target, prompts: list[list[int]], chunk: int | None, hit=None) -> PrefillJob:
    requests = [Request(i, p, SamplingParams(max_new_tokens=8), 4) for i, p in enumerate(prompts)]
    job = PrefillJob(target, None, requests, FEATURE_LAYERS, hit)
    while not job.is_done:
        job.advance(chunk)
    return job


def assert_same_prefill(direct: PrefillJob, padded: PrefillJob) -> None:
    assert direct.direct and not padded.direct
    assert torch.equal(direct._last_logits, padded._last_logits)
    features, padded_features = direct.features(), padded.features()
    for row, request in enumerate(direct.requests):
        length = len(request.prompt)
        assert torch.equal(features[row, :length], padded_features[row, :length])
        for mine, theirs in zip(direct.prompt_kv(row), padded.prompt_kv(row)):
            for a, b in zip(mine, theirs):
                assert torch.equal(a, b)
    (batch, outputs), (padded_batch, padded_outputs) = direct.finish(40), padded.finish(40)
    assert [o.new_token_ids for o in outputs] == [o.new_token_ids for o in padded_outputs]
    assert torch.equal(batch.cache.lengths, padded_batch.cache.lengths)
    for row, length in enumerate(batch.cache.lengths.tolist()):
        for mine, theirs in zip(batch.cache.keys + batch.cache.values,
                                padded_batch.cache.keys + padded_batch.cache.values):
            assert torch.equal(mine[row, :, :length], theirs[row, :, :length])


@pytest.mark.parametrize("chunk", [None, 5])
def test_a_request_alone_is_prefilled_by_the_native_decoder_with_the_same_bits(targets, chunk):
    native, padded = targets
    request_prompt = prompt(23)
    assert_same_prefill(prefill(native, [request_prompt], chunk), prefill(padded, [request_prompt], chunk))


def test_a_prefix_hit_starts_the_native_prefill_from_the_cached_blocks(targets):
    native, padded = targets
    cache = PrefixCache(max_bytes=1 << 30, block_tokens=8)
    first = prompt(19)
    job = prefill(native, [first], None)
    keys, values = job.prompt_kv(0)
    cache.insert(first, keys, values, job.features()[0])
    second = first[:17] + prompt(6, seed=1)
    hit = cache.match(second)
    assert hit.num_tokens == 16
    assert_same_prefill(prefill(native, [second], 4, hit), prefill(padded, [second], None))


@pytest.mark.parametrize("chunk", [None, 18])
def test_a_ragged_group_is_prefilled_by_the_native_decoder_with_the_same_bits(targets, chunk):
    """Chunks of 6 columns: the three prompts end in three different chunks."""
    native, padded = targets
    prompts = [prompt(7), prompt(15, seed=2), prompt(11, seed=3)]
    assert_same_prefill(prefill(native, prompts, chunk), prefill(padded, prompts, chunk))
