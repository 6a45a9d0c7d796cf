"""The plugin's RoPE tables equal Hugging Face's default and YaRN parameters (fp32, to one ulp)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash_trt.decoding.kernels.plugin.fields import AttentionFields
from dflash_trt.decoding.kernels.plugin.library import rope_table

YARN_CASES = [
    # (theta, head_dim, rope_parameters): gpt-oss, a truncate=False variant, mscale pair, explicit attention factor
    (150000.0, 64, {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}),
    (1e6, 128, {"factor": 4.0, "original_max_position_embeddings": 32768, "truncate": False}),
    (10000.0, 128, {"factor": 16.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                    "mscale_all_dim": 0.707}),
    (500000.0, 64, {"factor": 8.0, "original_max_position_embeddings": 8192, "attention_factor": 1.25,
                    "beta_fast": 16.0, "beta_slow": 2.0}),
]


def hf_parameters(theta: float, head_dim: int, yarn: dict | None) -> tuple[np.ndarray, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = {"rope_type": "yarn", "rope_theta": theta, **yarn} if yarn else {"rope_type": "default",
                                                                           "rope_theta": theta}
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=131072, rope_parameters=rope)
    init = ROPE_INIT_FUNCTIONS["yarn"] if yarn else LlamaRotaryEmbedding.compute_default_rope_parameters
    inv_freq, factor = init(config, torch.device("cpu"))
    return inv_freq.numpy(), float(factor)


def assert_within_one_ulp(ours: np.ndarray, theirs: np.ndarray) -> None:
    ulps = np.abs(ours.view(np.int32).astype(np.int64) - theirs.astype(np.float32).view(np.int32))
    assert ulps.max() <= 1, f"inv_freq differs by {ulps.max()} ulp at {np.argmax(ulps)}"


@pytest.mark.parametrize("theta,head_dim", [(10000.0, 64), (1e6, 128), (150000.0, 64), (500000.0, 128)])
def test_default_rope_matches_hugging_face(cpu_library, theta, head_dim):
    inv_freq, factor = rope_table(AttentionFields(8, 8, head_dim, rope_theta=theta))
    hf_inv, hf_factor = hf_parameters(theta, head_dim, None)
    assert_within_one_ulp(inv_freq, hf_inv)
    assert factor == hf_factor == 1.0


@pytest.mark.parametrize("theta,head_dim,yarn", YARN_CASES)
def test_yarn_matches_hugging_face(cpu_library, theta, head_dim, yarn):
    fields = AttentionFields.from_rope(8, 8, head_dim, theta, {"rope_type": "yarn", **yarn})
    inv_freq, factor = rope_table(fields)
    hf_inv, hf_factor = hf_parameters(theta, head_dim, yarn)
    assert_within_one_ulp(inv_freq, hf_inv)
    assert factor == pytest.approx(hf_factor, rel=1e-7)
