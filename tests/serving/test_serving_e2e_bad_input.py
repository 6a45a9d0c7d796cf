"""End to end: every bad input gets an error status and a clear message, and the server stays healthy."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_waits import is_healthy, post
from tritonclient.utils import InferenceServerException

from dflash_trt.serving.client import GrpcStream, RequestFailed, grpc_inputs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("body, message", [
    ({"max_tokens": 8}, "missing required input 'text_input'"),
    ({"text_input": "hi"}, "missing required input 'max_tokens'"),
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens must be in [1, 256], got 0"),
    ({"text_input": "hi", "max_tokens": -5}, "max_tokens must be in [1, 256], got -5"),
    ({"text_input": "hi", "max_tokens": 257}, "max_tokens must be in [1, 256], got 257"),
    ({"text_input": "", "max_tokens": 8}, "text_input is empty"),
    ({"text_input": "   ", "max_tokens": 8}, "text_input is empty"),
    ({"text_input": "word " * 600, "max_tokens": 8}, "exceeds the model's context of 512 tokens"),
    ({"text_input": "hi", "max_tokens": 8, "temperature": -1.0}, "temperature must be >= 0"),
    ({"text_input": "hi", "max_tokens": 8, "top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"text_input": "hi", "max_tokens": 8, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"text_input": "hi", "max_tokens": 8, "top_k": -2}, "top_k must be >= 0"),
    ({"text_input": "hi", "max_tokens": 8, "end_id": 49152}, "end_id 49152 is outside the vocabulary [0, 49152)"),
    ({"text_input": "hi", "max_tokens": 8, "end_id": 10**9}, "end_id 1000000000 is outside the vocabulary"),
])
def test_http_bad_input_is_refused_with_a_clear_message(triton, body, message):
    with pytest.raises(RequestFailed) as failure:
        post(triton, body)
    assert failure.value.status == 400
    assert message in str(failure.value)
    assert is_healthy(triton)


def test_a_json_value_of_the_wrong_type_is_refused_by_triton(triton):
    # Triton parses /generate bodies against the config itself (and answers 500 for this one).
    with pytest.raises(RequestFailed, match="Unable to parse 'data'") as failure:
        post(triton, {"text_input": "hi", "max_tokens": "eight"})
    assert failure.value.status >= 400
    assert is_healthy(triton)


def test_invalid_utf8_is_refused(triton):
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    stream = GrpcStream(triton.config.grpc_url)
    try:
        with pytest.raises(RequestFailed, match="text_input is not valid UTF-8"):
            list(stream.chunks(b"caf\xc3(", 8))
    finally:
        stream.close()
        client.close()
    assert is_healthy(triton)


def test_a_wrong_dtype_is_refused_by_triton(triton):
    stream = GrpcStream(triton.config.grpc_url)
    inputs = grpc_inputs("hi", 8, stream=True)
    bad = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
    bad.set_data_from_numpy(np.array([[8.0]], dtype=np.float32))
    inputs[1] = bad
    try:
        stream.client.async_stream_infer("ensemble", inputs)
        result, error = stream._responses.get(timeout=60)
    finally:
        stream.close()
    assert isinstance(error, InferenceServerException)
    assert "max_tokens" in str(error) and "FP32" in str(error) and "INT32" in str(error)
    assert is_healthy(triton)


def test_an_error_in_a_stream_ends_the_stream(triton):
    stream = GrpcStream(triton.config.grpc_url)
    try:
        with pytest.raises(RequestFailed, match="top_k must be >= 0"):
            list(stream.chunks("hi", 8, top_k=-1))
        # the same stream keeps working afterwards
        assert list(stream.chunks("hi", 3))[-1]["num_output_tokens"] == 3
    finally:
        stream.close()
