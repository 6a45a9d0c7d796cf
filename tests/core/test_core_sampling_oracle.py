"""The chi-square check the losslessness tests rely on: it accepts the right distribution, rejects a wrong one."""

import random

import pytest
from sampling_oracle import chi_square_pvalue

# A skewed distribution with cells too rare to test alone (pooled) and a pool too rare itself (folded).
EXPECTED = {(0,): 0.5, (1,): 0.3, (2,): 0.1987, (3,): 0.0008, (4,): 0.0005}
NUM_SAMPLES = 3000


def _draw(distribution, seed):
    rng = random.Random(seed)
    return rng.choices(list(distribution), weights=list(distribution.values()), k=NUM_SAMPLES)


def test_accepts_samples_of_the_expected_distribution():
    assert min(chi_square_pvalue(_draw(EXPECTED, seed), EXPECTED) for seed in range(5)) > 1e-3


def test_rejects_samples_of_a_slightly_different_distribution():
    shifted = {(0,): 0.45, (1,): 0.35, (2,): 0.1987, (3,): 0.0008, (4,): 0.0005}
    assert chi_square_pvalue(_draw(shifted, 0), EXPECTED) < 1e-6


def test_rejects_too_many_rare_tokens_even_when_folded_into_a_big_cell():
    rare_heavy = {(0,): 0.45, (1,): 0.3, (2,): 0.1987, (3,): 0.03, (4,): 0.0213}
    assert chi_square_pvalue(_draw(rare_heavy, 0), EXPECTED) < 1e-6


def test_a_token_outside_the_support_fails_at_once():
    with pytest.raises(AssertionError, match="outside the target's filter"):
        chi_square_pvalue(_draw(EXPECTED, 0) + [(5,)], EXPECTED)
