"""A tiny random target with prompts of many lengths and each prompt's greedy continuation."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, tiny_drafter_config

NUM_PROMPTS = 12
MAX_NEW_TOKENS = 30


@pytest.fixture(scope="session")
def pair():
    """(target, random drafter of block 8, prompts, greedy references) on a tiny Llama."""
    model = make_tiny_target("llama", seed=1)
    target = TargetModel(model)
    generator = torch.Generator().manual_seed(11)
    lengths = [1, 3, 40, 7, 2, 25, 11, 5, 33, 4, 9, 17][:NUM_PROMPTS]
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in lengths]
    plain = SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    references = [generate(target, None, [p], plain, block_size=1)[0].token_ids for p in prompts]
    return target, make_tiny_drafter(model.config, block_size=8), prompts, references


def oracle_for(pair, block_size: int, order: list[int]):
    """A JoiningOracle whose request k (in arrival order) is prompt order[k]."""
    from scheduler_oracle import JoiningOracle

    target, drafter, prompts, references = pair
    oracle = JoiningOracle(tiny_drafter_config(target.config, block_size=block_size),
                           [prompts[i] + references[i] for i in order])
    oracle.load_state_dict(drafter.state_dict())
    return oracle
