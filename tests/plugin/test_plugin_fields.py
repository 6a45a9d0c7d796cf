"""Plugin fields: bad values are rejected at creation with a message naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from dflash_trt.decoding.kernels.plugin.fields import FIELD_NAMES, ROPE_YARN, AttentionFields
from dflash_trt.decoding.kernels.plugin.library import (check_fields, library_field_names, plugin_identity,
                                                        validation_error)
from dflash_trt.errors import ConfigError

VALID = AttentionFields(num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1e6)


def test_accepts_valid_fields(cpu_library):
    assert validation_error(VALID) is None


@pytest.mark.parametrize("head_dim", [0, 32, 96, 256])
def test_rejects_unsupported_head_dim(cpu_library, head_dim):
    error = validation_error(dataclasses.replace(VALID, head_dim=head_dim))
    assert error is not None and "head_dim" in error and str(head_dim) in error


@pytest.mark.parametrize("num_kv_heads", [3, 5, 64, 0, -8])
def test_rejects_kv_heads_that_do_not_divide_heads(cpu_library, num_kv_heads):
    error = validation_error(dataclasses.replace(VALID, num_kv_heads=num_kv_heads))
    assert error is not None and "num_kv_heads" in error


@pytest.mark.parametrize("theta", [-10000.0, 0.0, float("inf"), float("nan")])
def test_rejects_non_positive_theta(cpu_library, theta):
    error = validation_error(dataclasses.replace(VALID, rope_theta=theta))
    assert error is not None and "rope_theta" in error


def test_rejects_yarn_without_original_context(cpu_library):
    fields = dataclasses.replace(VALID, rope_type=ROPE_YARN, yarn_factor=32.0)
    error = validation_error(fields)
    assert error is not None and "yarn_original_max_position_embeddings" in error


def test_rejects_unknown_rope_type(cpu_library):
    assert "rope_type" in validation_error(dataclasses.replace(VALID, rope_type=7))


def test_check_fields_raises_config_error_with_plugin_message(cpu_library):
    with pytest.raises(ConfigError, match="num_kv_heads' = 3"):
        check_fields(dataclasses.replace(VALID, num_kv_heads=3))


def test_field_names_match_the_cpp_constants(cpu_library):
    assert library_field_names() == FIELD_NAMES


def test_plugin_identity_is_stable(cpu_library):
    assert plugin_identity() == ("DFlashAttention", "1", "dflash")


def test_yarn_scaling_maps_to_fields():
    fields = AttentionFields.from_rope(64, 8, 64, 150000, {"rope_type": "yarn", "factor": 32.0,
                                                           "original_max_position_embeddings": 4096})
    assert (fields.rope_type, fields.yarn_factor, fields.yarn_original_max_position_embeddings) == (1, 32.0, 4096)
    assert (fields.yarn_beta_fast, fields.yarn_beta_slow, fields.yarn_attention_factor) == (32.0, 1.0, 0.0)


def test_rejects_unsupported_rope_scaling():
    with pytest.raises(ConfigError, match="linear"):
        AttentionFields.from_rope(8, 8, 64, 10000, {"rope_type": "linear", "factor": 2.0})
