"""Greedy DFlash output is token-identical to plain target decoding (transformers generate)."""

import pytest
import torch
from core_oracle import OracleDrafter

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.kernels.cpu_linear import pack_linear_layers
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, tiny_drafter_config

NUM_PROMPTS = 20
MAX_NEW_TOKENS = 29  # not a multiple of any block size below
BLOCK_SIZES = (1, 2, 8, 16)


def _reference(model, prompt, max_new_tokens):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                         do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["llama", "qwen3", "gpt_oss", "llama-packed"])
def setup(request):
    model = make_tiny_target(request.param.removesuffix("-packed"), seed=1)
    if request.param.endswith("-packed"):  # what load_target does on CPU (cpu_linear.py)
        assert pack_linear_layers(model) > 0
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 250, (int(n),), generator=generator).tolist()
               for n in torch.randint(1, 24, (NUM_PROMPTS,), generator=generator)]
    references = [_reference(model, p, MAX_NEW_TOKENS) for p in prompts]
    return request.param, model, prompts, references


def _drafters(model, prompts, references, block_size):
    random = make_tiny_drafter(model.config, block_size=block_size)
    oracle = OracleDrafter(tiny_drafter_config(model.config, block_size=block_size),
                           [p + r for p, r in zip(prompts, references)])
    oracle.load_state_dict(random.state_dict())
    return {"random": random, "oracle": oracle}


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_greedy_batch_equals_target_only_decoding(setup, block_size):
    arch, model, prompts, references = setup
    target = TargetModel(model)
    if arch.endswith("-packed"):
        target.use_bf16_draft_head()  # as load_target does where the CPU has bf16: drafts change, output must not
    for name, drafter in _drafters(model, prompts, references, block_size).items():
        results = generate(target, drafter, prompts, SamplingParams(max_new_tokens=MAX_NEW_TOKENS), block_size)
        for index, (result, reference) in enumerate(zip(results, references)):
            assert result.token_ids == reference, f"{arch} {name} drafter, block {block_size}, prompt {index}"
            assert result.finish_reason == "length"
        if name == "oracle" and block_size > 1:
            longest = max(max(r.acceptance_lengths) for r in results)
            assert longest >= min(block_size, 8), "the oracle should drive long acceptances"
            assert min(r.tau for r in results) > 1.5


@pytest.mark.parametrize("block_size", [1, 8])
def test_stop_token_truncates_right_after_it(setup, block_size):
    arch, model, prompts, references = setup
    target = TargetModel(model)
    drafter = _drafters(model, prompts, references, block_size)["oracle"]
    for index in range(0, NUM_PROMPTS, 4):
        stop = references[index][6]
        expected = references[index][: references[index].index(stop) + 1]
        params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, stop_token_ids=(stop, 255))
        result = generate(target, drafter, [prompts[index]], params, block_size)[0]
        assert result.token_ids == expected, f"{arch} block {block_size} prompt {index}"
        assert result.finish_reason == "stop"


def test_batch_gives_each_sequence_what_it_gets_alone(setup):
    arch, model, prompts, references = setup
    target = TargetModel(model)
    drafter = _drafters(model, prompts, references, 8)["oracle"]
    params = [SamplingParams(max_new_tokens=n, stop_token_ids=(references[i][10],) if i % 3 == 0 else ())
              for i, n in enumerate(range(5, 5 + NUM_PROMPTS))]
    together = generate(target, drafter, prompts, params)
    assert len({tuple(r.acceptance_lengths) for r in together}) > 10  # the rows really diverged
    for index, prompt in enumerate(prompts):
        drafter.references, drafter.hash_keys = [prompt + references[index]], [index]
        alone = generate(target, drafter, [prompt], params[index])[0]
        assert together[index].token_ids == alone.token_ids, f"{arch} prompt {index}"
        assert together[index].acceptance_lengths == alone.acceptance_lengths
