"""The tree sweep: tau per budget, each output checked against plain greedy decoding."""

from __future__ import annotations

import torch

from dflash_trt.benchmarks.tree_sweep import sweep_family
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


def test_every_budget_gives_plain_tokens_and_a_tau():
    model = make_tiny_target("llama", seed=5)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (5, 11)]
    row = sweep_family(target, drafter, prompts, SamplingParams(max_new_tokens=12), [0, 8])
    assert row["identical"] == {0: True, 8: True}
    assert 1.0 <= row["tau"][0] <= row["tau"][8] <= 4.0
