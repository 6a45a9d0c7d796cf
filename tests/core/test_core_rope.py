import pytest
import torch
from transformers import Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from dflash_trt.decoding.kernels.rope import RotaryEmbedding

YARN_CASES = [
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
     "beta_slow": 1.0, "truncate": False},  # gpt-oss
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen3 long context
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048, "mscale": 1.0,
     "mscale_all_dim": 0.5},
]


@pytest.mark.parametrize("scaling", YARN_CASES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_yarn_frequencies_and_factor_match_transformers(scaling, head_dim):
    theta = 150000.0
    config = Qwen3Config(head_dim=head_dim, rope_parameters={**scaling, "rope_theta": theta},
                         max_position_embeddings=131072)
    expected_inv_freq, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rope = RotaryEmbedding.from_config(head_dim, theta, scaling)
    torch.testing.assert_close(rope.inv_freq, expected_inv_freq, rtol=0, atol=0)
    assert rope.attention_factor == pytest.approx(expected_factor, rel=1e-12)


def test_default_rope_rotates_pairs_half_apart():
    rope = RotaryEmbedding(head_dim=4, theta=10000.0)
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    cos, sin = rope.cos_sin(torch.tensor([1]))
    out = RotaryEmbedding.apply(x, cos, sin)
    # Pair (0, 2) rotates by angle 1 rad: (cos 1, 0, sin 1, 0).
    torch.testing.assert_close(out, torch.tensor([[torch.cos(torch.tensor(1.0)), 0.0,
                                                   torch.sin(torch.tensor(1.0)), 0.0]]))
