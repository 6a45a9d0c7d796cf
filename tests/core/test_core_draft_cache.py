"""The draft cache holds exactly the committed context: cached rows + new rows == block start."""

import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


def test_cache_invariant_holds_at_every_draft(monkeypatch):
    model = make_tiny_target("qwen3", seed=2)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    prompt = [5, 6, 7, 8, 9]
    calls = []
    forward = type(drafter).forward

    def spy(self, block_embeds, features, ctx_lens, cache, *rest):
        before = cache.lens.clone()
        out = forward(self, block_embeds, features, ctx_lens, cache, *rest)
        calls.append((int(before[0]), int(ctx_lens[0]), int(cache.lens[0])))
        return out

    monkeypatch.setattr(type(drafter), "forward", spy)
    steps = []
    result = generate(target, drafter, [prompt], SamplingParams(max_new_tokens=20))[0]
    # Block start of step i = prompt length + tokens committed before it, minus the pending anchor token.
    committed = 1
    for length, drafts in zip(result.acceptance_lengths, result.draft_lengths):
        if drafts:  # a last step with one token left verifies a block of 1, without a draft call
            steps.append(len(prompt) + committed - 1)
        committed += length
    assert len(calls) == len(steps)
    for (cached, new_rows, after), start in zip(calls, steps):
        assert cached + new_rows == start == after
    assert calls[0] == (0, len(prompt), len(prompt))  # the first draft sees every prompt position


def test_context_rows_after_a_verify_are_the_committed_ones():
    model = make_tiny_target("llama", seed=2)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    seen = []
    original = drafter.propose

    def spy(target_, block, features, ctx_lens, cache, **kwargs):
        seen.append(int(ctx_lens[0]))
        return original(target_, block, features, ctx_lens, cache, **kwargs)

    drafter.propose = spy
    result = generate(target, drafter, [[1, 2, 3]], SamplingParams(max_new_tokens=12))[0]
    # After each verify, a + 1 rows (anchor + accepted drafts) become context; the first draft sees the prompt.
    num_drafted = sum(1 for drafts in result.draft_lengths if drafts)  # a last 1-token step drafts nothing
    assert seen == ([3] + result.acceptance_lengths)[:num_drafted]
    assert torch.is_tensor(drafter.fc.weight)


def test_a_sliding_window_cache_stays_bounded_at_long_contexts():
    from dflash_trt.decoding.model.drafters import DraftCache

    model = make_tiny_target("qwen3", seed=2)
    target = TargetModel(model)
    drafter = make_tiny_drafter(model.config, block_size=4, sliding_window=6, is_causal=False)
    caches = []
    new_cache = drafter.new_cache

    def keep(batch, capacity):
        caches.append(new_cache(batch, capacity))
        return caches[-1]

    drafter.new_cache = keep
    lens_seen = []
    propose = drafter.propose

    def record(target, block, features, ctx_lens, cache, **kwargs):
        out = propose(target, block, features, ctx_lens, cache, **kwargs)
        lens_seen.append(int(cache.lens[0]))
        return out

    drafter.propose = record
    prompt = list(range(3, 60))
    result = generate(target, drafter, [prompt], SamplingParams(max_new_tokens=30))[0]
    cache = caches[0]
    assert isinstance(cache, DraftCache) and cache.capacity >= len(prompt) + 30
    assert [k.shape[2] for k in cache.k] == [5, 5]  # window - 1 rows per layer, whatever the context
    # The context the cache has taken in grows past the window while its rows stay bounded (the finished
    # request's rows are freed, so the count is read at each draft).
    assert lens_seen[-1] == len(prompt) + 29 - result.acceptance_lengths[-1] and lens_seen[-1] > 6
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert result.token_ids == reference[0, len(prompt):].tolist()  # still lossless
