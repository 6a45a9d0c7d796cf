"""End to end: tritonclient gRPC streaming with TensorRT-LLM's tensor shapes (a leading batch dimension on
every input, as its ensemble clients send them) and with today's shapes (no batch dimension, on
`ensemble_unbatched`), and HTTP generate / generate_stream on both; all give the same answer."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from dflash_trt.serving.client import generate

pytestmark = pytest.mark.slow

PROMPT = "Tell me about the tides."
MAX_TOKENS = 12
TYPES = {"O": "BYTES", "b": "BOOL", "i": "INT32", "f": "FP32"}


def request_arrays(stream: bool, batch_dim: bool) -> dict[str, np.ndarray]:
    """What TensorRT-LLM's end_to_end clients send (text_input [[prompt]], max_tokens [[n]], ...), or
    the same tensors without the leading batch dimension."""
    arrays = {"text_input": np.array([PROMPT.encode()], dtype=object),
              "max_tokens": np.array([MAX_TOKENS], dtype=np.int32), "stream": np.array([stream]),
              "temperature": np.array([0.0], dtype=np.float32), "top_k": np.array([1], dtype=np.int32),
              "top_p": np.array([1.0], dtype=np.float32), "end_id": np.array([-1], dtype=np.int32),
              "stop_words": np.array([b"no such words", b"nor these"], dtype=object),
              "exclude_input_in_output": np.array([True])}
    return {name: a.reshape(1, -1) if batch_dim else a for name, a in arrays.items()}


def inputs_for(client_module, arrays):
    inputs = []
    for name, array in arrays.items():
        tensor = client_module.InferInput(name, list(array.shape), TYPES[array.dtype.kind])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_stream(triton, model: str, batch_dim: bool) -> list[np.ndarray]:
    """The text_output tensors of one streamed generation over gRPC."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs_for(grpcclient, request_arrays(True, batch_dim)),
                                  enable_empty_final_response=True)
        texts = []
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                raise error
            if result.get_response().outputs:
                texts.append(result.as_numpy("text_output"))
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return texts
    finally:
        client.stop_stream()
        client.close()


@pytest.fixture(scope="module")
def expected(triton) -> str:
    return generate(triton.config.http_url, PROMPT, MAX_TOKENS, exclude_input_in_output=True, end_id=-1,
                    stop_words=["no such words", "nor these"])["text_output"]


def joined(texts: list[np.ndarray]) -> str:
    return "".join(t.decode() for array in texts for t in array.reshape(-1))


def test_grpc_streaming_with_tensorrt_llm_shapes(triton, expected):
    texts = grpc_stream(triton, "ensemble", batch_dim=True)
    assert len(texts) > 1 and all(t.shape == (1,) for t in texts)  # as NVIDIA's postprocessing returns it
    assert joined(texts) == expected


def test_grpc_streaming_with_todays_shapes_on_the_unbatched_ensemble(triton, expected):
    texts = grpc_stream(triton, "ensemble_unbatched", batch_dim=False)
    assert all(t.shape == (1,) for t in texts)
    assert joined(texts) == expected


@pytest.mark.parametrize("model", ["ensemble", "ensemble_unbatched"])
def test_http_generate_and_generate_stream_take_the_same_json_on_both_ensembles(triton, expected, model):
    """Over HTTP, Triton serves decoupled models (ours, and TensorRT-LLM's streaming ensemble) through the
    generate endpoints only (its /infer answers 501); their JSON bodies carry no shapes."""
    import json
    import urllib.request

    body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "exclude_input_in_output": True, "end_id": -1,
            "stop_words": ["no such words", "nor these"]}
    url = f"{triton.config.http_url}/v2/models/{model}/generate"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        assert json.loads(response.read())["text_output"] == expected
    request = urllib.request.Request(url + "_stream", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        events = [json.loads(line[len(b"data:"):]) for line in response if line.startswith(b"data:")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected


def test_a_batch_of_two_is_refused_with_tritons_message(triton):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    arrays = {name: np.concatenate([a, a]) for name, a in request_arrays(True, batch_dim=True).items()}
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("ensemble", inputs_for(grpcclient, arrays))
        _result, error = responses.get(timeout=300)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(error, InferenceServerException) and "batch-size must be <= 1" in str(error)
