"""A client of the `tensorrt_llm` model that follows NVIDIA's llmapi client flow (triton_backend/tools/
llmapi_client.py and tests/test_llmapi_cancel.py), written from the contract: gRPC `async_infer` with
`text_input` [1] and `sampling_param_max_tokens` [1], the request id set, errors and results collected by a
callback, `text_output[0].decode()` read; cancelling either by a second request with `stop` = true and
the same request id, or by cancelling the call."""

from __future__ import annotations

import queue

import numpy as np

MODEL = "tensorrt_llm"
TYPES = {"O": "BYTES", "b": "BOOL", "i": "INT32", "u": "UINT64", "f": "FP32"}


def tensors(grpcclient, arrays: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), TYPES[array.dtype.kind])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def prompt_arrays(prompt: str, max_tokens: int, **extra) -> dict[str, np.ndarray]:
    return {"text_input": np.array([prompt], dtype=object),
            "sampling_param_max_tokens": np.array([max_tokens], dtype=np.int32), **extra}


def stop_arrays() -> dict[str, np.ndarray]:
    """NVIDIA's stop signal: an empty text_input and stop = true."""
    return {"text_input": np.empty([1], dtype=np.bytes_).astype(object), "stop": np.array([True], dtype=bool)}


class LlmApiClient:
    """async_infer calls whose results and errors land in one queue, as in NVIDIA's client."""

    def __init__(self, grpc_url: str):
        import tritonclient.grpc as grpcclient

        self.grpcclient = grpcclient
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.completed: queue.Queue = queue.Queue()

    def send(self, arrays: dict[str, np.ndarray], request_id: str):
        """Returns the call (its cancel() is NVIDIA's --stop-via-request-cancel)."""
        return self.client.async_infer(MODEL, tensors(self.grpcclient, arrays), request_id=request_id,
                                       callback=lambda result, error: self.completed.put(error or result),
                                       parameters={"Streaming": False})

    def next(self, timeout_s: float = 300.0):
        return self.completed.get(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()


def is_cancelled(result) -> bool:
    """NVIDIA's answer to a cancelled request: a CANCELLED error (a gRPC stream carries only its message)."""
    from tritonclient.utils import InferenceServerException

    if not isinstance(result, InferenceServerException):
        return False
    if result.status() is not None:
        return result.status() == "StatusCode.CANCELLED"
    return "cancelled" in str(result).lower()


def describe(result) -> str:
    """A result or error as an assertion shows it (an InferenceServerException's repr is empty)."""
    if isinstance(result, Exception):
        status = getattr(result, "status", lambda: None)()
        return f"{type(result).__name__}(status={status}, message={str(result)!r})"
    return repr(result)


def text_of(result) -> str:
    assert not isinstance(result, Exception), str(result)
    return result.as_numpy("text_output")[0].decode("utf-8")
