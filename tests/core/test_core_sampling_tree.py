"""Sampled tree verification is lossless: sample-and-walk emits the target's own (filtered, penalized) distribution.

Every committed token is the target's keyed draw at a node whose prefix is the committed one; a chi-square test over
3000 seeds compares the emitted continuations with the exact joint distribution, enumerated over a tiny vocabulary.
The same check fails when the walk is broken on purpose (a miss follows the drafter's best child instead).
"""

import itertools

import pytest
import torch
from sampling_oracle import chi_square_pvalue

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step import logits_processors
from dflash_trt.decoding.step.sampling import SamplingParams, probabilities
from dflash_trt.decoding.step.verify import TreeVerify
from dflash_trt.decoding.step.verify import tree as tree_module
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

VOCAB = 6
NUM_TOKENS = 3  # the first comes from the prefill; the next two from tree verification
NUM_SAMPLES = 3000
SIGNIFICANCE = 1e-3
PROMPT = [1, 4, 2, 5]


@pytest.fixture(scope="module")
def pair():
    model = make_tiny_target("llama", vocab_size=VOCAB, logit_scale=3.0, seed=3)
    return TargetModel(model), make_tiny_drafter(model.config, block_size=4, mask_token_id=0, seed=1)


def exact_joint(target, params) -> dict[tuple, float]:
    """P(t1..tn | PROMPT) with the request's logits processors (penalties count prompt and output) applied to
    every prefix, then temperature, top-k and top-p."""
    joint = {(): 1.0}
    for length in range(NUM_TOKENS):
        for prefix in itertools.product(range(VOCAB), repeat=length):
            with torch.inference_mode():
                logits = target.model(torch.tensor([PROMPT + list(prefix)])).logits[:, -1].float()
            if params.has_logits_processors:
                logits = logits_processors.process(logits, params, PROMPT + list(prefix), length)
            row = probabilities(logits, params)[0]
            for token in range(VOCAB):
                joint[prefix + (token,)] = joint[prefix] * float(row[token])
    return {k: v for k, v in joint.items() if len(k) == NUM_TOKENS}


def sampled(target, drafter, filters):
    params = [SamplingParams(max_new_tokens=NUM_TOKENS, seed=seed, **filters) for seed in range(NUM_SAMPLES)]
    results = generate(target, drafter, [PROMPT] * NUM_SAMPLES, params, 4, TreeVerify(6, 3))
    return [tuple(r.token_ids) for r in results], sum(r.num_accepted_tokens for r in results), params[0]


@pytest.mark.parametrize("filters", [dict(temperature=0.8), dict(temperature=1.0, top_k=3),
                                     dict(temperature=1.0, top_p=0.8, repetition_penalty=1.5, presence_penalty=0.5)],
                         ids=["temperature", "top_k", "top_p-penalties"])
def test_sampled_tree_tokens_follow_the_target_distribution(pair, filters):
    target, drafter = pair
    samples, accepted, params = sampled(target, drafter, filters)
    assert accepted > NUM_SAMPLES // 4, "tree nodes should often be accepted, so the walk is exercised"
    assert chi_square_pvalue(samples, exact_joint(target, params)) > SIGNIFICANCE


def test_a_dflash2_lattice_tree_is_lossless_at_temperature_one(pair):
    """DFlash2 draws its chain drafts from the selector's q; the tree ignores q and ranks the lattice: still lossless."""
    target, _ = pair
    dflash2 = make_tiny_drafter(target.model.config, block_size=4, mask_token_id=0, seed=1, family="dflash2",
                                selector_top_k=4)
    samples, accepted, params = sampled(target, dflash2, dict(temperature=1.0))
    assert accepted > NUM_SAMPLES // 4
    assert chi_square_pvalue(samples, exact_joint(target, params)) > SIGNIFICANCE


def test_a_walk_that_follows_the_drafter_on_a_miss_fails_the_check(pair, monkeypatch):
    original = tree_module._walk

    def follow_the_drafter(tree, logits, greedy, request):
        path, token = original(tree, logits, greedy, request)
        node = path[-1] if path else -1
        children = [n for n, parent in enumerate(tree.parents) if parent == node]
        if children and len(path) + 1 < request.remaining:  # take the drafter's best child instead of the draw
            return path + [children[0]], token
        return path, token

    monkeypatch.setattr(tree_module, "_walk", follow_the_drafter)
    target, drafter = pair
    samples, _, params = sampled(target, drafter, dict(temperature=1.0))
    assert chi_square_pvalue(samples, exact_joint(target, params)) < 1e-6
