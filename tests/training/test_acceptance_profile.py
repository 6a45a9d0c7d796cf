"""The teacher-forced acceptance profile reproduces the greedy loop's acceptance lengths exactly."""

import pytest
import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target
from dflash_trt.training.acceptance_profile import acceptance_profile, greedy_path
from dflash_trt.training.features import target_features

VOCAB = 24  # small, so random drafts are sometimes accepted and acceptance lengths vary
BLOCK_SIZE = 4


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_the_path_over_teacher_forced_anchors_is_the_loops(family):
    model = make_tiny_target("qwen3", vocab_size=VOCAB, logit_scale=3.0, seed=5)
    drafter = make_tiny_drafter(model.config, block_size=BLOCK_SIZE, family=family, seed=3)
    target = TargetModel(model)
    generator = torch.Generator().manual_seed(11)
    accepted_any = 0
    for length, max_new in ((3, 19), (7, 21), (12, 24)):
        prompt = torch.randint(0, VOCAB - 1, (length,), generator=generator).tolist()
        result = generate(target, drafter, [prompt], SamplingParams(max_new_tokens=max_new))[0]
        ids = prompt + result.token_ids
        features = target_features(model, [ids], drafter.config.target_layer_ids)[0]
        profile = acceptance_profile(target, drafter, ids, len(prompt), features)
        assert len(profile.accepted) == max_new - 1
        assert profile.path_lengths == result.acceptance_lengths
        assert profile.tau == pytest.approx(result.tau)
        accepted_any += sum(profile.accepted)
    assert accepted_any > 0, "some drafts should be accepted, so acceptance is compared too"


def test_the_path_shortens_the_last_block_and_cuts_at_the_answer_end():
    # Every draft right: steps of block_size tokens, the last one cut to what is left.
    assert greedy_path([3] * 9, 10, 4) == [4, 4, 1]
    # No draft right: one token per step.
    assert greedy_path([0] * 4, 5, 4) == [1, 1, 1, 1]
    # Step 1 accepts 1 draft (anchor 0), step 2 lands on anchor 2 and accepts 3 of which 2 are left.
    assert greedy_path([1, 0, 3, 3, 0], 6, 4) == [2, 3]
