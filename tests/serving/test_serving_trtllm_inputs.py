"""TensorRT-LLM's optional ensemble inputs: accepted at their neutral values, refused (naming them) otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.serving.requests import InvalidRequest, RequestLimits, parse_request, parse_token_request
from dflash_trt.serving.trtllm_inputs import COMPAT_INPUTS

LIMITS = RequestLimits(max_tokens=64, max_context_tokens=128)
# TensorRT-LLM's triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt, for these inputs.
TRTLLM = {
    "decoder_text_input": ("TYPE_STRING", "1"), "num_return_sequences": ("TYPE_INT32", "1"),
    "bad_words": ("TYPE_STRING", "-1"), "pad_id": ("TYPE_INT32", "1"), "length_penalty": ("TYPE_FP32", "1"),
    "repetition_penalty": ("TYPE_FP32", "1"), "min_tokens": ("TYPE_INT32", "1"),
    "presence_penalty": ("TYPE_FP32", "1"), "frequency_penalty": ("TYPE_FP32", "1"),
    "return_log_probs": ("TYPE_BOOL", "1"), "return_context_logits": ("TYPE_BOOL", "1"),
    "return_generation_logits": ("TYPE_BOOL", "1"), "return_perf_metrics": ("TYPE_BOOL", "1"),
    "return_num_input_tokens": ("TYPE_BOOL", "1"), "return_num_output_tokens": ("TYPE_BOOL", "1"),
    "beam_width": ("TYPE_INT32", "1"), "embedding_bias_words": ("TYPE_STRING", "-1"),
    "embedding_bias_weights": ("TYPE_FP32", "-1"),
}
# Values a TensorRT-LLM client may send with a feature off (batch dimension included).
NEUTRAL = {
    "decoder_text_input": np.array([[b""]], dtype=object), "num_return_sequences": np.array([[1]], np.int32),
    "bad_words": np.array([[b""]], dtype=object), "pad_id": np.array([[2]], np.int32),
    "length_penalty": np.array([[1.3]], np.float32), "repetition_penalty": np.array([[1.0]], np.float32),
    "min_tokens": np.array([[1]], np.int32), "presence_penalty": np.array([[0.0]], np.float32),
    "frequency_penalty": np.array([[0.0]], np.float32), "return_log_probs": np.array([[False]]),
    "return_context_logits": np.array([[False]]), "return_generation_logits": np.array([[False]]),
    "return_perf_metrics": np.array([[False]]), "return_num_input_tokens": np.array([[False]]),
    "return_num_output_tokens": np.array([[True]]), "beam_width": np.array([[1]], np.int32),
    "embedding_bias_words": np.array([[b""]], dtype=object), "embedding_bias_weights": np.zeros((1, 0), np.float32),
}


def base():
    return {"text_input": np.array([[b"Hello"]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}


def test_the_names_types_and_dims_are_tensorrt_llms():
    assert {name: (spec.triton_type, spec.dims) for name, spec in COMPAT_INPUTS.items()} == TRTLLM


def test_every_neutral_value_at_once_changes_nothing():
    assert parse_request({**base(), **NEUTRAL}, LIMITS) == parse_request(base(), LIMITS)


@pytest.mark.parametrize("name, value, message", [
    ("beam_width", np.array([[4]], np.int32), "input 'beam_width' = 4 is not supported by DFlash serving; send 1"),
    ("beam_width", np.array([[0]], np.int32), "input 'beam_width' = 0 is not supported"),
    ("bad_words", np.array([[b"foo", b""]], dtype=object), "'bad_words' = ['foo', ''] is not supported"),
    ("return_log_probs", np.array([[True]]), "'return_log_probs' = True is not supported"),
    ("repetition_penalty", np.array([[1.2]], np.float32), "'repetition_penalty' = 1.2"),
    ("presence_penalty", np.array([[0.5]], np.float32), "'presence_penalty' = 0.5"),
    ("frequency_penalty", np.array([[-0.5]], np.float32), "'frequency_penalty' = -0.5"),
    ("min_tokens", np.array([[5]], np.int32), "'min_tokens' = 5 is not supported"),
    ("num_return_sequences", np.array([[2]], np.int32), "'num_return_sequences' = 2"),
    ("decoder_text_input", np.array([[b"context"]], dtype=object), "'decoder_text_input' = 'context'"),
    ("embedding_bias_words", np.array([[b"cat"]], dtype=object), "'embedding_bias_words' = 'cat'"),
    ("embedding_bias_weights", np.array([[0.5]], np.float32), "'embedding_bias_weights' = 0.5"),
    ("return_context_logits", np.array([[True]]), "'return_context_logits' = True"),
    ("return_generation_logits", np.array([[True]]), "'return_generation_logits' = True"),
    ("return_perf_metrics", np.array([[True]]), "'return_perf_metrics' = True"),
    ("return_num_input_tokens", np.array([[True]]), "'return_num_input_tokens' = True"),
    ("length_penalty", np.array([[np.nan]], np.float32), "'length_penalty' = nan"),
])
def test_a_value_that_asks_for_something_unsupported_is_refused_by_name(name, value, message):
    with pytest.raises(InvalidRequest) as failure:
        parse_request({**base(), **NEUTRAL, name: value}, LIMITS)
    assert message in str(failure.value) and "\n" not in str(failure.value)


def test_a_wrong_dtype_is_refused_like_any_input():
    with pytest.raises(InvalidRequest, match="input 'beam_width' must be INT32, got float32"):
        parse_request({**base(), "beam_width": np.array([[1.0]], np.float32)}, LIMITS)


def test_the_dflash_model_takes_only_its_own_inputs():
    # The ensemble validates these in preprocessing; the dflash model's own contract stays narrow.
    arrays = {"input_ids": np.array([1, 2], np.int32), "max_tokens": np.array([4], np.int32),
              "beam_width": np.array([1], np.int32)}
    with pytest.raises(InvalidRequest, match="unknown input tensor\\(s\\): beam_width"):
        parse_token_request(arrays, LIMITS)
