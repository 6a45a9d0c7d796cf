"""TensorRT-LLM's optional ensemble inputs: accepted at their neutral values, refused (naming them) otherwise;
its logits controls (min_tokens, bad_words, penalties) are served and validated."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.decoding.step.sampling import bad_words_ids
from dflash_trt.errors import DFlashError
from dflash_trt.serving.generation import sampling_params
from dflash_trt.serving.requests import INPUTS, InvalidRequest, RequestLimits, parse_request, parse_token_request
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
    "min_tokens": np.array([[0]], np.int32), "presence_penalty": np.array([[0.0]], np.float32),
    "frequency_penalty": np.array([[0.0]], np.float32), "return_log_probs": np.array([[False]]),
    "return_context_logits": np.array([[False]]), "return_generation_logits": np.array([[False]]),
    "return_perf_metrics": np.array([[False]]), "return_num_input_tokens": np.array([[False]]),
    "return_num_output_tokens": np.array([[True]]), "beam_width": np.array([[1]], np.int32),
    "embedding_bias_words": np.array([[b""]], dtype=object), "embedding_bias_weights": np.zeros((1, 0), np.float32),
}


def base():
    return {"text_input": np.array([[b"Hello"]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}


LOGITS_CONTROLS = ("bad_words", "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty")


def test_the_names_types_and_dims_are_tensorrt_llms():
    assert {name: (spec.triton_type, spec.dims) for name, spec in COMPAT_INPUTS.items()} == {
        name: spec for name, spec in TRTLLM.items() if name not in LOGITS_CONTROLS}
    # The logits controls are served: inputs of the dflash model too, with TensorRT-LLM's types.
    assert {name: INPUTS[name][1] for name in LOGITS_CONTROLS} == {name: TRTLLM[name][0] for name in LOGITS_CONTROLS}


def test_every_neutral_value_at_once_changes_nothing():
    assert parse_request({**base(), **NEUTRAL}, LIMITS) == parse_request(base(), LIMITS)


@pytest.mark.parametrize("name, value, message", [
    ("beam_width", np.array([[4]], np.int32), "input 'beam_width' = 4 is not supported by DFlash serving; send 1"),
    ("beam_width", np.array([[0]], np.int32), "input 'beam_width' = 0 is not supported"),
    ("return_log_probs", np.array([[True]]), "'return_log_probs' = True is not supported"),
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


def test_the_logits_controls_reach_the_request():
    request = parse_request({**base(), "bad_words": np.array([[b"foo bar", b"", b"baz"]], dtype=object),
                             "min_tokens": np.array([[5]], np.int32),
                             "repetition_penalty": np.array([[1.2]], np.float32),
                             "presence_penalty": np.array([[0.5]], np.float32),
                             "frequency_penalty": np.array([[-0.5]], np.float32)}, LIMITS)
    assert request.bad_words == ("foo bar", "baz") and request.min_tokens == 5
    assert (request.repetition_penalty, request.presence_penalty, request.frequency_penalty) == pytest.approx(
        (1.2, 0.5, -0.5))
    # The dflash model takes them too (the ensemble passes them on).
    arrays = {"input_ids": np.array([1, 2], np.int32), "max_tokens": np.array([4], np.int32),
              "min_tokens": np.array([3], np.int32), "bad_words": np.array([b"x"], dtype=object)}
    request, _ = parse_token_request(arrays, LIMITS)
    assert request.min_tokens == 3 and request.bad_words == ("x",)


@pytest.mark.parametrize("name, value, message", [
    ("repetition_penalty", np.array([[0.0]], np.float32), "repetition_penalty must be a finite number > 0, got 0"),
    ("repetition_penalty", np.array([[-1.5]], np.float32), "repetition_penalty must be a finite number > 0, got -1.5"),
    ("presence_penalty", np.array([[np.inf]], np.float32), "presence_penalty must be a finite number, got inf"),
    ("frequency_penalty", np.array([[np.nan]], np.float32), "frequency_penalty must be a finite number, got nan"),
    ("min_tokens", np.array([[-2]], np.int32), "min_tokens must be >= 0, got -2"),
    ("min_tokens", np.array([[1.0]], np.float32), "input 'min_tokens' must be INT32, got float32"),
])
def test_a_bad_logits_control_is_refused_in_one_line(name, value, message):
    with pytest.raises(InvalidRequest) as failure:
        parse_request({**base(), name: value}, LIMITS)
    assert str(failure.value) == message


def test_bad_words_are_tokenized_without_special_tokens(smollm2_tokenizer):
    words = (" Paris", "New York", "\u00e9t\u00e9")
    expected = tuple(tuple(smollm2_tokenizer.encode(w, add_special_tokens=False)) for w in words)
    assert bad_words_ids(words, smollm2_tokenizer) == expected
    assert any(len(ids) > 1 for ids in expected)
    request = parse_request({**base(), "bad_words": np.array([[w.encode() for w in words]], dtype=object),
                             "min_tokens": np.array([[4]], np.int32)}, LIMITS)
    params = sampling_params(request, (2,), smollm2_tokenizer)
    assert params.bad_words_ids == expected and params.min_tokens == 4 and params.stop_token_ids == (2,)


def test_bad_words_without_a_tokenizer_are_refused():
    with pytest.raises(DFlashError, match="bad_words need the target's tokenizer"):
        bad_words_ids(("foo",), None)
