"""End to end: the `tensorrt_llm` model rendered decoupled (`--tensorrt-llm-decoupled`, NVIDIA's
triton_config.decoupled: true): streaming over gRPC streams and HTTP generate_stream, cancel by `stop` and
by cancelling the stream, each stopping the generation within one decoding step; the same text as the
ensemble on the same server."""

from __future__ import annotations

import json
import os
import queue
import urllib.request

import numpy as np
import pytest
from llmapi_client import MODEL, is_cancelled, prompt_arrays, stop_arrays, tensors
from triton_waits import metric_total, steps_until_idle, wait_for

from dflash_trt.serving.client import generate

pytestmark = pytest.mark.slow

PROMPT = "Tell me about the tides."
MAX_TOKENS = 16
CANCELLED_LOG = "tensorrt_llm: request cancelled"


@pytest.fixture(scope="module")
def streaming_triton(tiny_engine, tmp_path_factory, step_gate_dir):
    from dflash_trt.serving.cancellation import STEP_GATE_ENV
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    repo = tmp_path_factory.mktemp("decoupled-repo")
    render_repository(RepoConfig(tiny_engine, repo, max_tokens_limit=256, max_context_tokens=512, num_threads=1,
                                 block_policy="fixed", tensorrt_llm_decoupled=True))
    os.environ[STEP_GATE_ENV] = str(step_gate_dir)
    try:
        server = serve_on_free_ports(repo, ready_timeout_s=600,
                                     log_path=tmp_path_factory.mktemp("triton") / "server.log")
    finally:
        del os.environ[STEP_GATE_ENV]
    with server:
        yield server


class Stream:
    """One gRPC stream to the tensorrt_llm model; results and errors in arrival order."""

    def __init__(self, server):
        import tritonclient.grpc as grpcclient

        self.grpcclient = grpcclient
        self.results: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(server.config.grpc_url)
        self.client.start_stream(callback=lambda result, error: self.results.put(error or result))

    def send(self, arrays, request_id: str = "") -> None:
        self.client.async_stream_infer(MODEL, tensors(self.grpcclient, arrays), request_id=request_id,
                                       enable_empty_final_response=True)

    def texts(self, timeout_s: float = 300.0) -> list[str]:
        """The text of every response until the final one."""
        texts = []
        while True:
            result = self.results.get(timeout=timeout_s)
            assert not isinstance(result, Exception), str(result)
            if result.get_response().outputs:
                texts.append(result.as_numpy("text_output")[0].decode("utf-8"))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts

    def first_error(self, timeout_s: float = 300.0):
        """Skip the pieces sent before it (the first decoding steps of a held generation)."""
        while True:
            result = self.results.get(timeout=timeout_s)
            if isinstance(result, Exception):
                return result

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def streaming(prompt: str, max_tokens: int) -> dict[str, np.ndarray]:
    return prompt_arrays(prompt, max_tokens, streaming=np.array([True]))


def test_streamed_pieces_join_to_the_ensembles_answer(streaming_triton):
    expected = generate(streaming_triton.config.http_url, PROMPT, MAX_TOKENS, exclude_input_in_output=True)
    stream = Stream(streaming_triton)
    try:
        stream.send(streaming(PROMPT, MAX_TOKENS), "1")
        pieces = stream.texts()
        stream.send(prompt_arrays(PROMPT, MAX_TOKENS), "2")  # streaming = false on a stream: one answer
        whole = stream.texts()
    finally:
        stream.close()
    assert len(pieces) > 1 and "".join(pieces) == expected["text_output"]
    assert whole == [generate(streaming_triton.config.http_url, PROMPT, MAX_TOKENS)["text_output"]]


def test_http_generate_stream_and_generate(streaming_triton):
    url = f"{streaming_triton.config.http_url}/v2/models/{MODEL}/generate"
    body = {"text_input": PROMPT, "sampling_param_max_tokens": MAX_TOKENS, "streaming": True}
    request = urllib.request.Request(url + "_stream", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        events = [json.loads(line[len(b"data:"):]) for line in response if line.startswith(b"data:")]
    expected = generate(streaming_triton.config.http_url, PROMPT, MAX_TOKENS, exclude_input_in_output=True)
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected["text_output"]
    body = {"text_input": PROMPT, "sampling_param_max_tokens": MAX_TOKENS,
            "sampling_param_exclude_input_from_output": True}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        assert json.loads(response.read())["text_output"] == expected["text_output"]


def _first_piece(server, stream: Stream, request_id: str) -> None:
    wait_for(lambda: metric_total(server, "dflash_requests_in_flight") == 0, "no request in flight")
    stream.send(streaming("a long answer please", 200), request_id)
    first = stream.results.get(timeout=300)
    assert not isinstance(first, Exception), str(first)


def test_a_stop_request_ends_a_stream_within_one_step(streaming_triton, step_gate):
    logged = streaming_triton.log.count(CANCELLED_LOG)
    stream, stopper = Stream(streaming_triton), Stream(streaming_triton)
    try:
        with step_gate.holding():
            _first_piece(streaming_triton, stream, "long-1")
            stopper.send(stop_arrays(), "long-1")
            assert is_cancelled(stopper.results.get(timeout=300))
            assert is_cancelled(stream.first_error())
            assert steps_until_idle(streaming_triton, step_gate) <= 1
    finally:
        stream.close()
        stopper.close()
    wait_for(lambda: streaming_triton.log.count(CANCELLED_LOG) == logged + 1, "the cancellation logged")


def test_cancelling_the_stream_ends_the_generation_within_one_step(streaming_triton, step_gate):
    logged = streaming_triton.log.count(CANCELLED_LOG)
    stream = Stream(streaming_triton)
    with step_gate.holding():
        _first_piece(streaming_triton, stream, "long-2")
        stream.close(cancel=True)
        assert steps_until_idle(streaming_triton, step_gate) <= 1
    wait_for(lambda: streaming_triton.log.count(CANCELLED_LOG) == logged + 1, "the cancellation logged")


def test_grpc_model_infer_is_refused_by_triton_when_decoupled(streaming_triton):
    """What NVIDIA's llmapi_client.py (gRPC ModelInfer) gets from a decoupled model, NVIDIA's included."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(streaming_triton.config.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
            client.infer(MODEL, tensors(grpcclient, prompt_arrays(PROMPT, 4)))
    finally:
        client.close()
