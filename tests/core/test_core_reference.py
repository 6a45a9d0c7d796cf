"""Tokens, acceptance lengths and every drafted block equal the reference's (PyPI `dflash` 0.1.0), for
DFlash and DFlash2, full and sliding-window attention, with and without logit softcapping."""

import pytest
import torch
from reference_dflash import record_verify_blocks, reference_drafter, run_reference

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

VOCAB = 24  # small, so random drafts are sometimes accepted and acceptance lengths vary
MAX_NEW_TOKENS = 19  # the last block is shorter than the block size
BLOCK_SIZE = 4
WINDOW = 5  # shorter than the prompts: the window binds


@pytest.fixture(scope="module")
def model():
    return make_tiny_target("qwen3", vocab_size=VOCAB, logit_scale=3.0, seed=5)


@pytest.fixture(scope="module")
def prompts():
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(0, VOCAB - 1, (int(n),), generator=generator).tolist() for n in (3, 7, 12)]


CASES = {
    "full": {},
    "sliding": dict(sliding_window=WINDOW, is_causal=False),
    "sliding-causal": dict(sliding_window=WINDOW),  # no is_causal key: a sliding layer is causal
    "softcap": dict(output_multiplier=0.5, final_logit_softcapping=4.0),
    "sliding-softcap": dict(sliding_window=WINDOW, is_causal=False, output_multiplier=0.5,
                            final_logit_softcapping=4.0, input_embedding_scale=1.5),
}


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_the_reference(model, prompts, family, case):
    drafter = make_tiny_drafter(model.config, block_size=BLOCK_SIZE, family=family, seed=3, **CASES[case])
    reference = reference_drafter(drafter)
    target = TargetModel(model)
    total_accepted = 0
    for prompt in prompts:
        tokens, lengths, ref_blocks = run_reference(reference, model, prompt, MAX_NEW_TOKENS)
        blocks, hook = record_verify_blocks(model)
        try:
            result = generate(target, drafter, [prompt], SamplingParams(max_new_tokens=MAX_NEW_TOKENS))[0]
        finally:
            hook.remove()
        assert blocks[1:] == ref_blocks, f"{family} {case}: drafted blocks differ"
        assert result.token_ids == tokens and len(tokens) == MAX_NEW_TOKENS
        assert result.acceptance_lengths == lengths
        total_accepted += sum(lengths) - len(lengths)
    assert len(ref_blocks[-1]) < BLOCK_SIZE, "the last block should be the shortened one"
    assert total_accepted > 0, "some drafts should be accepted, so acceptance is compared too"


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_stop_tokens_truncate_as_the_reference_does(model, prompts, family):
    drafter = make_tiny_drafter(model.config, block_size=BLOCK_SIZE, family=family, seed=3)
    reference = reference_drafter(drafter)
    target = TargetModel(model)
    for prompt in prompts:
        full, _, _ = run_reference(reference, model, prompt, MAX_NEW_TOKENS)
        stop = full[8]
        tokens, lengths, _ = run_reference(reference, model, prompt, MAX_NEW_TOKENS, stop_token_ids=[stop])
        params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, stop_token_ids=(stop,))
        result = generate(target, drafter, [prompt], params)[0]
        assert result.token_ids == tokens and result.acceptance_lengths == lengths


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_a_batch_with_ragged_last_blocks_equals_each_row_alone(model, prompts, family):
    drafter = make_tiny_drafter(model.config, block_size=BLOCK_SIZE, family=family, seed=3,
                                sliding_window=WINDOW, is_causal=False)
    target = TargetModel(model)
    many = prompts * 3
    params = [SamplingParams(max_new_tokens=7 + i) for i in range(len(many))]  # rows end at different steps
    together = generate(target, drafter, many, params)
    for prompt, p, result in zip(many, params, together):
        alone = generate(target, drafter, [prompt], p)[0]
        assert result.token_ids == alone.token_ids and result.acceptance_lengths == alone.acceptance_lengths
