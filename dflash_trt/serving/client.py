"""Small clients of the ensemble: HTTP /generate, HTTP /generate_stream (SSE) and gRPC streaming.

They speak the TensorRT-LLM tensor names, so they also work against a TensorRT-LLM ensemble.
Used by the demo, the serving benchmark and the end-to-end tests.
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from typing import Iterator

import numpy as np

from dflash_trt.errors import DFlashError

MODEL = "ensemble"

# name -> (numpy dtype, Triton datatype) of the optional inputs a client may set.
_GRPC_TYPES = {
    "text_input": (object, "BYTES"),
    "max_tokens": (np.int32, "INT32"),
    "stream": (bool, "BOOL"),
    "temperature": (np.float32, "FP32"),
    "top_k": (np.int32, "INT32"),
    "top_p": (np.float32, "FP32"),
    "seed": (np.uint64, "UINT64"),
    "stop_words": (object, "BYTES"),
    "end_id": (np.int32, "INT32"),
    "exclude_input_in_output": (bool, "BOOL"),
    "min_tokens": (np.int32, "INT32"),
    "bad_words": (object, "BYTES"),
    "repetition_penalty": (np.float32, "FP32"),
    "presence_penalty": (np.float32, "FP32"),
    "frequency_penalty": (np.float32, "FP32"),
}
_WORD_LISTS = ("stop_words", "bad_words")


class RequestFailed(DFlashError):
    """The server answered with an error (bad input, or a failure while generating)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def generate(http_url: str, text: str, max_tokens: int, timeout_s: float = 300.0, **params) -> dict:
    """One non-streaming answer from /v2/models/ensemble/generate."""
    return _post_json(f"{http_url}/v2/models/{MODEL}/generate", _body(text, max_tokens, params), timeout_s)


def generate_stream(http_url: str, text: str, max_tokens: int, timeout_s: float = 300.0,
                    **params) -> Iterator[dict]:
    """Server-sent events of /v2/models/ensemble/generate_stream, one dict per chunk."""
    body = _body(text, max_tokens, {**params, "stream": True})
    request = urllib.request.Request(f"{http_url}/v2/models/{MODEL}/generate_stream",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as error:
        raise RequestFailed(_error_text(error.read()), error.code) from None
    with response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[len("data:"):])
            if "error" in event:
                raise RequestFailed(event["error"])
            yield event


def grpc_inputs(text, max_tokens: int, **params) -> list:
    """tritonclient.grpc InferInput list for the ensemble (text may be bytes, e.g. to send bad UTF-8).

    Every tensor has TensorRT-LLM's leading batch dimension of 1: text_input [1,1], stop_words [1,N]."""
    import tritonclient.grpc as grpcclient

    values = {"text_input": [text.encode() if isinstance(text, str) else text], "max_tokens": [max_tokens]}
    for name, value in params.items():
        if name not in _GRPC_TYPES:
            raise ValueError(f"unknown input {name!r}")
        values[name] = [w.encode() for w in value] if name in _WORD_LISTS else [value]
    inputs = []
    for name, value in values.items():
        dtype, triton_type = _GRPC_TYPES[name]
        array = np.array([value], dtype=dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), triton_type)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class GrpcStream:
    """One gRPC bidirectional stream; `chunks` yields output dicts until the final response."""

    def __init__(self, grpc_url: str):
        import tritonclient.grpc as grpcclient

        self._responses: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.client.start_stream(callback=lambda result, error: self._responses.put((result, error)))

    def chunks(self, text, max_tokens: int, timeout_s: float = 300.0, request_id: str = "",
               **params) -> Iterator[dict]:
        self.client.async_stream_infer(MODEL, grpc_inputs(text, max_tokens, stream=True, **params),
                                       request_id=request_id, enable_empty_final_response=True)
        while True:
            result, error = self._responses.get(timeout=timeout_s)
            if error is not None:
                raise RequestFailed(str(error))
            final = result.get_response().parameters.get("triton_final_response")
            outputs = _outputs(result)
            if outputs:
                yield outputs
            if final is not None and final.bool_param:
                return

    def cancel(self) -> None:
        """Close the stream and cancel what is in flight (the server stops generating)."""
        self.client.stop_stream(cancel_requests=True)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def _outputs(result) -> dict:
    outputs = {}
    for output in result.get_response().outputs:
        value = result.as_numpy(output.name).reshape(-1)[0]
        outputs[output.name] = value.decode("utf-8") if isinstance(value, bytes) else value.item()
    return outputs


def _body(text: str, max_tokens: int, params: dict) -> dict:
    return {"text_input": text, "max_tokens": max_tokens, **params}


def _post_json(url: str, body: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise RequestFailed(_error_text(error.read()), error.code) from None


def _error_text(payload: bytes) -> str:
    try:
        return json.loads(payload)["error"]
    except (ValueError, KeyError):
        return payload.decode("utf-8", errors="replace")


def join_text(chunks: list[dict]) -> str:
    return "".join(chunk.get("text_output", "") for chunk in chunks)
