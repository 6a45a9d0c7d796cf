"""End to end: the legacy `ensemble` read the way TensorRT-LLM's own ensemble client reads it.

NVIDIA's triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py sends every input with a
leading batch dimension over a gRPC stream, asks for `text_output` only (plus `batch_index` when it
batches its inputs), and reads `text_output[0].decode()` and `batch_index[0][0]`: streamed pieces are
appended, a non-streamed answer is taken whole. The client below follows that reading logic (it is ours,
written from the contract) so that a change of shape that breaks NVIDIA's client breaks this test.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest

from dflash_trt.serving.client import generate

pytestmark = pytest.mark.slow

PROMPT = "Why do leaves change colour?"
MAX_TOKENS = 10


def nvidia_style_inputs(grpcclient, stream: bool) -> list:
    arrays = {"text_input": np.array([[PROMPT]]).astype(object),
              "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
              "stream": np.array([[stream]], dtype=bool), "beam_width": np.array([[1]], dtype=np.int32),
              "temperature": np.array([[0.0]], dtype=np.float32),
              "num_return_sequences": np.array([[1]], dtype=np.int32),
              "exclude_input_in_output": np.array([[True]], dtype=bool)}
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape),
                                       {"O": "BYTES", "b": "BOOL", "i": "INT32", "f": "FP32"}[array.dtype.kind])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def read_like_nvidia(triton, stream: bool, ask_batch_index: bool) -> str:
    """One request on a fresh stream; the text assembled as NVIDIA's client assembles it."""
    import tritonclient.grpc as grpcclient

    outputs = [grpcclient.InferRequestedOutput("text_output")]
    if ask_batch_index:
        outputs.append(grpcclient.InferRequestedOutput("batch_index"))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        client.async_stream_infer("ensemble", nvidia_style_inputs(grpcclient, stream), outputs=outputs,
                                  request_id="1")
        client.stop_stream()  # waits until the server has closed the stream
    finally:
        client.close()
    text = [""]
    pieces = 0
    while not results.empty():
        result = results.get()
        assert not isinstance(result, Exception), str(result)
        output = result.as_numpy("text_output")
        batch_index = result.as_numpy("batch_index")
        batch_index = 0 if batch_index is None else batch_index[0][0]
        piece = output[0].decode("utf-8")  # what fails on a [1, 1] text_output
        text[batch_index] = text[batch_index] + piece if stream else piece
        pieces += 1
    assert pieces >= (2 if stream else 1)
    return text[0]


@pytest.fixture(scope="module")
def expected(triton) -> str:
    return generate(triton.config.http_url, PROMPT, MAX_TOKENS, exclude_input_in_output=True)["text_output"]


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
def test_nvidia_client_reads_our_ensemble(triton, expected, stream):
    assert read_like_nvidia(triton, stream, ask_batch_index=False) == expected


def test_nvidia_client_with_batched_inputs_gets_batch_index(triton, expected):
    """--batch-inputs asks for batch_index; a batch of one prompt is served (more are refused by Triton:
    test_serving_e2e_client_shapes.py)."""
    assert read_like_nvidia(triton, True, ask_batch_index=True) == expected


def test_statistics_have_the_shape_of_tensorrt_llm_ensemble_outputs(triton):
    """Scalars per row come back as [1, 1] on `ensemble` (NVIDIA's clients index them [0][0]), as [1] on
    `ensemble_unbatched`."""
    import tritonclient.grpc as grpcclient

    for model, shape in (("ensemble", (1, 1)), ("ensemble_unbatched", (1,))):
        inputs = []
        for name, array in {"text_input": np.array([PROMPT]).astype(object),
                            "max_tokens": np.array([MAX_TOKENS], dtype=np.int32)}.items():
            array = array.reshape(1, 1) if model == "ensemble" else array
            tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype.kind == "O" else "INT32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(triton.config.grpc_url)
        try:
            client.start_stream(callback=lambda result, error: results.put(error or result))
            client.async_stream_infer(model, inputs)
            client.stop_stream()
        finally:
            client.close()
        result = results.get(timeout=5)
        assert not isinstance(result, Exception), str(result)
        assert result.as_numpy("text_output").shape == (1,)
        for name in ("num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate",
                     "finish_reason", "batch_index"):
            assert result.as_numpy(name).shape == shape, (model, name)
        assert result.as_numpy("batch_index").reshape(-1)[0] == 0


def test_nvidias_step_by_step_test_is_told_what_to_call(triton):
    """end_to_end_test.py (without --test-llmapi) first calls TensorRT-LLM's own `preprocessing` step with
    QUERY, BAD_WORDS_DICT, STOP_WORDS_DICT and REQUEST_OUTPUT_LEN; ours is another step under that name."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = []
    for name, array in {"QUERY": np.array([[PROMPT]]).astype(object), "BAD_WORDS_DICT": np.array([[""]], dtype=object),
                        "STOP_WORDS_DICT": np.array([[""]], dtype=object),
                        "REQUEST_OUTPUT_LEN": np.array([[MAX_TOKENS]], dtype=np.int32)}.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype.kind == "O" else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("preprocessing", inputs, request_id="0")
    finally:
        client.close()
    message = str(raised.value)
    assert "not TensorRT-LLM's preprocessing model" in message and "REQUEST_OUTPUT_LEN" in message
    assert "'ensemble'" in message and "'tensorrt_llm'" in message
