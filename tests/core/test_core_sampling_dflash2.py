"""Sampled DFlash2 is lossless: drafts drawn from the selector's q, checked by rejection against it.

The emitted tokens must follow the target's own filtered distribution exactly (chi-square against the
enumerated joint); with a q that is not the one the drafts were drawn from, the same check must fail.
"""

import pytest
import torch
from sampling_oracle import chi_square_pvalue, exact_joint

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.drafters import DFlash2Drafter, Proposal
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

VOCAB = 6
NUM_TOKENS = 3  # the first from the prefill, then one verify of a shortened block of 3 slots
NUM_SAMPLES = 3000
SIGNIFICANCE = 1e-3  # fixed seeds make each outcome deterministic; this is the level it was checked at
PROMPT = [1, 4, 2, 5]


class UniformQDrafter(DFlash2Drafter):
    """Draws its drafts from the selector's q but reports a uniform q over the candidates: a broken q."""

    def propose(self, *args, **kwargs):
        proposal = super().propose(*args, **kwargs)
        return Proposal(proposal.drafts, proposal.candidates, torch.full_like(proposal.q, 1 / proposal.q.shape[-1]))


@pytest.fixture(scope="module")
def pair():
    model = make_tiny_target("llama", vocab_size=VOCAB, logit_scale=3.0, seed=3)
    drafter = make_tiny_drafter(model.config, block_size=4, mask_token_id=0, family="dflash2", selector_top_k=3,
                                seed=4)
    return TargetModel(model), drafter


def _pvalue(target, params, results):
    expected = exact_joint(target, PROMPT, params, NUM_TOKENS, VOCAB)
    return chi_square_pvalue([tuple(r.token_ids) for r in results], expected)


def _run(target, drafter, filters):
    params = [SamplingParams(max_new_tokens=NUM_TOKENS, seed=seed, **filters) for seed in range(NUM_SAMPLES)]
    return params[0], generate(target, drafter, [PROMPT] * NUM_SAMPLES, params)


@pytest.mark.parametrize("filters", [dict(temperature=0.7), dict(temperature=1.0, top_k=4),
                                     dict(temperature=1.2, top_p=0.8)], ids=["temperature", "top_k", "top_p"])
def test_sampled_dflash2_follows_the_target_distribution(pair, filters):
    target, drafter = pair
    params, results = _run(target, drafter, filters)
    accepted = sum(r.num_accepted_tokens for r in results)
    assert NUM_SAMPLES // 5 < accepted, "drafts should often be accepted, so both branches are tested"
    assert _pvalue(target, params, results) > SIGNIFICANCE


def test_the_check_fails_when_q_is_not_the_drafts_distribution(pair):
    target, drafter = pair
    broken = UniformQDrafter(drafter.config)
    broken.load_state_dict(drafter.state_dict())
    params, results = _run(target, broken.eval(), dict(temperature=0.7))
    assert _pvalue(target, params, results) < 1e-6


def test_same_seed_gives_the_same_sample_alone_or_in_a_batch(pair):
    target, drafter = pair
    prompts = [PROMPT, PROMPT[:2], [3]] * 2
    params = [SamplingParams(max_new_tokens=9 + i, temperature=1.0, seed=i) for i in range(len(prompts))]
    together = generate(target, drafter, prompts, params)
    for prompt, p, result in zip(prompts, params, together):
        alone = generate(target, drafter, [prompt], p)[0]
        assert result.token_ids == alone.token_ids and result.acceptance_lengths == alone.acceptance_lengths
