"""The confidence interval of a served ratio (benchmarks/stats.py): Student's t over the rounds' log ratios."""

import math
import random

import pytest
from scipy import stats as scipy_stats

from dflash_trt.benchmarks.stats import ratio_interval, t_quantile_975


def test_the_t_quantiles_are_students():
    for degrees in range(1, 201):
        assert t_quantile_975(degrees) == pytest.approx(scipy_stats.t.ppf(0.975, degrees), abs=1e-3), degrees
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


def test_the_interval_is_the_t_interval_of_the_log_ratios():
    ratios = [0.972, 1.039, 0.988, 0.973, 1.01, 0.968, 0.964, 0.976, 0.998, 1.005]
    logs = [math.log(r) for r in ratios]
    low, high = scipy_stats.t.interval(0.95, len(logs) - 1, loc=sum(logs) / len(logs), scale=scipy_stats.sem(logs))
    assert ratio_interval(ratios) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-4)
    assert ratio_interval([1.02, 1.02, 1.02]) == pytest.approx((1.02, 1.02))


def test_fewer_than_three_rounds_give_no_interval():
    assert ratio_interval([0.9, 1.1]) is None
    assert ratio_interval([0.9, None, 1.1]) is None  # a round without a ratio does not count
    assert ratio_interval([]) is None


def test_the_interval_covers_the_true_ratio_95_times_in_100():
    """Simulated rounds: a true ratio of 0.98 and 5% noise per round; the interval must hold the truth in ~95% of
    the experiments at every number of rounds (a normal quantile in place of t's covers ~88% at 5 rounds)."""
    rng = random.Random(0)
    for rounds in (3, 5, 10):
        covered = 0
        for _ in range(4000):
            low, high = ratio_interval([0.98 * math.exp(rng.gauss(0.0, 0.05)) for _ in range(rounds)])
            covered += low <= 0.98 <= high
        assert 0.935 <= covered / 4000 <= 0.965, (rounds, covered)
