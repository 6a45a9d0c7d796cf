"""Sampled DFlash is lossless: emitted tokens follow the target's own (filtered) distribution."""

import pytest
import torch
from core_oracle import SelfDrafter
from sampling_oracle import chi_square_pvalue, exact_joint

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams, probabilities
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

VOCAB = 6
NUM_TOKENS = 3  # the first comes from the prefill; the next two from verification
NUM_SAMPLES = 3000
SIGNIFICANCE = 1e-3  # fixed seeds make the outcome deterministic; this is the level it was checked at
PROMPT = [1, 4, 2, 5]


@pytest.fixture(scope="module")
def pair():
    model = make_tiny_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
    return TargetModel(model), make_tiny_drafter(model.config, block_size=4, mask_token_id=0)


def _self_drafter(target, drafter, num_prompts):
    """Drafts the target's greedy continuation, so drafts are often accepted (random drafts rarely are)."""
    cache = {}

    def greedy_next(tokens):
        key = tuple(tokens)
        if key not in cache:
            with torch.inference_mode():
                cache[key] = int(target.model(torch.tensor([tokens])).logits[0, -1].argmax())
        return cache[key]

    self_drafter = SelfDrafter(drafter.config, [PROMPT] * num_prompts, greedy_next)
    self_drafter.load_state_dict(drafter.state_dict())
    return self_drafter


@pytest.mark.parametrize("filters", [dict(temperature=0.8), dict(temperature=1.0, top_k=3),
                                     dict(temperature=1.0, top_p=0.7)], ids=["temperature", "top_k", "top_p"])
def test_sampled_tokens_follow_the_target_distribution(pair, filters):
    target, drafter = pair
    params = [SamplingParams(max_new_tokens=NUM_TOKENS, seed=seed, **filters) for seed in range(NUM_SAMPLES)]
    results = generate(target, _self_drafter(target, drafter, NUM_SAMPLES), [PROMPT] * NUM_SAMPLES, params)
    accepted = sum(r.num_accepted_tokens for r in results)
    assert accepted > NUM_SAMPLES // 4, "drafts should often be accepted, so both paths are tested"
    expected = exact_joint(target, PROMPT, params[0], NUM_TOKENS, VOCAB)
    assert chi_square_pvalue([tuple(r.token_ids) for r in results], expected) > SIGNIFICANCE


def test_same_seed_gives_same_sample_alone_or_in_a_batch(pair):
    target, drafter = pair
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed) for seed in range(6)]
    together = generate(target, drafter, [PROMPT, PROMPT[:2]] * 3, params)
    for index, p in enumerate(params):
        alone = generate(target, drafter, [[PROMPT, PROMPT[:2]][index % 2]], p)[0]
        assert together[index].token_ids == alone.token_ids


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=1))
    torch.testing.assert_close(probs, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=-0.1), "temperature must be >= 0"), (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p must be in"), (dict(top_k=-1), "top_k must be >= 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be positive"),
])
def test_rejects_bad_sampling_parameters(bad, message):
    with pytest.raises(Exception, match=message):
        SamplingParams(**bad)
