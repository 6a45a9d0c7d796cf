"""The exact distribution of a short sampled continuation, and the chi-square check of samples against it.

Shared by the losslessness tests of every drafter family: the emitted continuations of many seeded requests
must follow the target's own filtered joint distribution, enumerated over a tiny vocabulary.
"""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from scipy.stats import chisquare

from dflash_trt.decoding.step.sampling import probabilities

MIN_EXPECTED = 5  # chi-square needs about this many expected hits per cell to be trustworthy


def exact_joint(target, prompt: list[int], params, num_tokens: int, vocab: int) -> dict[tuple, float]:
    """P(t1..tn | prompt) under the target's filtered distribution, for every continuation of n tokens."""
    joint = {(): 1.0}
    for prefix_len in range(num_tokens):
        prefixes = list(itertools.product(range(vocab), repeat=prefix_len))
        with torch.inference_mode():
            logits = target.model(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1].float()
        for prefix, row in zip(prefixes, probabilities(logits, params)):
            for token in range(vocab):
                joint[prefix + (token,)] = joint[prefix] * float(row[token])
    return {k: v for k, v in joint.items() if len(k) == num_tokens}


def chi_square_pvalue(samples: list[tuple], expected: dict[tuple, float]) -> float:
    """p-value of `samples` (continuations) under `expected`; asserts none falls outside its support.

    Cells expected at least MIN_EXPECTED times are tested alone; the rest are pooled into one cell, which
    is itself folded into the last big cell when even the pool is too rare.
    """
    counts = Counter(samples)
    assert all(expected.get(key, 0) > 0 for key in counts), "a token outside the target's filter was emitted"
    total = len(samples)
    big = [k for k, p in expected.items() if p * total >= MIN_EXPECTED]
    observed = [counts[k] for k in big] + [total - sum(counts[k] for k in big)]
    wanted = [expected[k] * total for k in big] + [total * (1 - sum(expected[k] for k in big))]
    if wanted[-1] < MIN_EXPECTED:
        rare_observed, rare_wanted = observed.pop(), wanted.pop()
        observed[-1] += rare_observed
        wanted[-1] += rare_wanted
    scale = total / sum(wanted)  # fp32 probabilities sum to 1 only within ~1e-7
    return chisquare(observed, [w * scale for w in wanted]).pvalue
