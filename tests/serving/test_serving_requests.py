"""Validation of the ensemble's inputs: every user mistake becomes a message naming the tensor."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.serving.requests import InvalidRequest, RequestLimits, parse_request

LIMITS = RequestLimits(max_tokens=64, max_context_tokens=128)


def inputs(**overrides):
    arrays = {"text_input": np.array([b"Hello"], dtype=object), "max_tokens": np.array([8], dtype=np.int32)}
    arrays.update(overrides)
    return {k: v for k, v in arrays.items() if v is not None}


def test_parses_a_minimal_request_with_greedy_defaults():
    request = parse_request(inputs(), LIMITS)
    assert (request.text, request.max_tokens, request.temperature, request.stream) == ("Hello", 8, 0.0, False)
    assert request.stop_words == () and request.seed is None and request.end_id is None


def test_parses_every_optional_input():
    request = parse_request(
        inputs(
            stream=np.array([True]),
            temperature=np.array([0.7], dtype=np.float32),
            top_k=np.array([5], dtype=np.int32),
            top_p=np.array([0.9], dtype=np.float32),
            seed=np.array([123], dtype=np.uint64),
            stop_words=np.array([b"\n\n", b"User:"], dtype=object),
            end_id=np.array([2], dtype=np.int32),
            exclude_input_in_output=np.array([True]),
        ),
        LIMITS,
    )
    assert request.stream and request.top_k == 5 and request.seed == 123 and request.end_id == 2
    assert request.top_p == pytest.approx(0.9) and request.temperature == pytest.approx(0.7)
    assert request.stop_words == ("\n\n", "User:") and request.exclude_input_in_output


def test_accepts_a_batch_dimension_of_one():
    request = parse_request(inputs(max_tokens=np.array([[4]], dtype=np.int32)), LIMITS)
    assert request.max_tokens == 4


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"text_input": None}, "missing required input 'text_input'"),
        ({"max_tokens": None}, "missing required input 'max_tokens'"),
        ({"max_tokens": np.array([0], dtype=np.int32)}, r"max_tokens must be in \[1, 64\], got 0"),
        ({"max_tokens": np.array([-3], dtype=np.int32)}, r"max_tokens must be in \[1, 64\], got -3"),
        ({"max_tokens": np.array([65], dtype=np.int32)}, r"max_tokens must be in \[1, 64\], got 65"),
        ({"max_tokens": np.array([8.0], dtype=np.float32)}, "input 'max_tokens' must be INT32"),
        ({"temperature": np.array([1], dtype=np.int32)}, "input 'temperature' must be FP32"),
        ({"text_input": np.array([b"  \n"], dtype=object)}, "text_input is empty"),
        ({"text_input": np.array([b"\xff\xfeabc"], dtype=object)}, "text_input is not valid UTF-8"),
        ({"text_input": np.array([b"a", b"b"], dtype=object)}, "must hold exactly one element"),
        ({"temperature": np.array([-0.5], dtype=np.float32)}, "temperature must be >= 0"),
        ({"temperature": np.array([np.nan], dtype=np.float32)}, "temperature must be >= 0"),
        ({"top_p": np.array([0.0], dtype=np.float32)}, r"top_p must be in \(0, 1\]"),
        ({"top_p": np.array([1.5], dtype=np.float32)}, r"top_p must be in \(0, 1\]"),
        ({"top_k": np.array([-1], dtype=np.int32)}, "top_k must be >= 0"),
        ({"end_id": np.array([-2], dtype=np.int32)}, "end_id must be >= 0, or -1 to ignore end-of-sequence"),
        ({"stop_words": np.array([b"\xc3"], dtype=object)}, "stop_words is not valid UTF-8"),
        ({"bogus": np.array([1])}, "unknown input tensor"),
    ],
)
def test_rejects_bad_input(overrides, message):
    with pytest.raises(InvalidRequest, match=message):
        parse_request(inputs(**overrides), LIMITS)
