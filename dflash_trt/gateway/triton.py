"""The gateway's only way to generate: the Triton ensemble over gRPC streaming (tritonclient's asyncio API).

Every generation is requested with stream=true, also for non-streaming HTTP clients: Triton 2.51
passes an ensemble cancellation on to the dflash model only through the chunks that follow it,
so a request that sends no chunks until the end could not be stopped when its client goes away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from dflash_trt.gateway.errors import APIError, invalid, server_error
from dflash_trt.gateway.protocol import Sampling
from dflash_trt.serving.requests import IGNORE_EOS

ENSEMBLE = "ensemble"


@dataclass(frozen=True)
class Piece:
    """One response of the ensemble: the text it adds and the cumulative statistics."""

    text: str
    finish_reason: str  # "" until the last piece
    num_output_tokens: int
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    acceptance_rate: float
    num_cached_tokens: int = 0  # prompt tokens the server took from its prefix cache
    num_verify_steps: int = 0  # verify steps so far (0: a server that does not report them)


class TritonEnsemble:
    """An asyncio gRPC client of one Triton server; one bidirectional stream per generation."""

    def __init__(self, url: str, model_name: str = ENSEMBLE):
        from tritonclient.grpc import aio

        self.url, self.model_name = url, model_name
        self.client = aio.InferenceServerClient(url)

    async def is_ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready()) and bool(await self.client.is_model_ready(self.model_name))
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            return False

    async def parameters(self, model: str) -> dict[str, str]:
        """The string parameters of a model's config (preprocessing holds engine_dir and the limits)."""
        config = await self.client.get_model_config(model, as_json=True)
        entries = config.get("config", config).get("parameters", {})
        return {key: entry.get("string_value", "") for key, entry in entries.items()}

    async def close(self) -> None:
        await self.client.close()

    def start(self, prompt: str, sampling: Sampling, max_tokens: int) -> "Generation":
        """Open the gRPC stream of one generation (the request goes out with the first read)."""
        request = {"model_name": self.model_name, "inputs": request_inputs(prompt, sampling, max_tokens)}

        async def one_request():
            yield request

        return Generation(self.client.stream_infer(one_request()))


class Generation:
    """One generation streaming from Triton.

    cancel() is synchronous so that any cleanup can call it, even inside an already cancelled task
    (where nothing can be awaited any more): an HTTP client that goes away must never leave its
    generation running in Triton.
    """

    def __init__(self, call):
        self._call = call
        self.is_done = False

    async def next(self) -> Piece:
        """The next piece; raises APIError for Triton's errors and a closed or unreachable server."""
        import grpc

        try:
            result, error = await self._call.__anext__()
        except StopAsyncIteration:
            self.is_done = True
            raise server_error("Triton closed the stream before the final response") from None
        except grpc.RpcError as rpc_error:
            self.is_done = True
            raise server_error(f"Triton is unavailable: {_rpc_message(rpc_error)}", 503) from None
        if error is not None:
            self.is_done = True
            raise triton_error(str(error))
        piece = read_piece(result)
        self.is_done = bool(piece.finish_reason)
        return piece

    def cancel(self) -> None:
        """Stop the generation in Triton unless it already ended."""
        if not self.is_done:
            self.is_done = True
            self._call.cancel()


def _rpc_message(error) -> str:
    details = getattr(error, "details", None)
    return details() if callable(details) else str(error)


def request_inputs(prompt: str, sampling: Sampling, max_tokens: int) -> list:
    """The ensemble's input tensors (TensorRT-LLM's names and shapes) for one generation."""
    from tritonclient.grpc import InferInput

    arrays = {
        "text_input": np.array([prompt.encode("utf-8")], dtype=np.object_),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
        "stream": np.array([True]),
        "temperature": np.array([sampling.temperature], dtype=np.float32),
        "top_p": np.array([sampling.top_p], dtype=np.float32),
        "top_k": np.array([sampling.top_k], dtype=np.int32),
        "exclude_input_in_output": np.array([True]),
    }
    if sampling.seed is not None:
        arrays["seed"] = np.array([sampling.seed], dtype=np.uint64)
    if sampling.ignore_eos:
        arrays["end_id"] = np.array([IGNORE_EOS], dtype=np.int32)
    if sampling.stop:
        arrays["stop_words"] = np.array([w.encode("utf-8") for w in sampling.stop], dtype=np.object_)
    arrays.update(logits_control_arrays(sampling))
    inputs = []
    for name, array in arrays.items():
        array = array.reshape(1, -1)  # TensorRT-LLM's layout: a leading batch dimension of 1
        tensor = InferInput(name, list(array.shape), _triton_dtype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def logits_control_arrays(sampling: Sampling) -> dict[str, np.ndarray]:
    """The logits controls a request sets, as the ensemble's TensorRT-LLM-named tensors (neutral ones are left
    out, so that a plain request stays the same request)."""
    arrays = {}
    if sampling.min_tokens:
        arrays["min_tokens"] = np.array([sampling.min_tokens], dtype=np.int32)
    if sampling.bad_words:
        arrays["bad_words"] = np.array([w.encode("utf-8") for w in sampling.bad_words], dtype=np.object_)
    for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if getattr(sampling, name) != neutral:
            arrays[name] = np.array([getattr(sampling, name)], dtype=np.float32)
    return arrays


def _triton_dtype(array: np.ndarray) -> str:
    return {"O": "BYTES", "b": "BOOL"}.get(array.dtype.kind) or {
        np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64"}[array.dtype]


def read_piece(result) -> Piece:
    def scalar(name):
        value = result.as_numpy(name)
        return None if value is None else value.reshape(-1)[0]

    def text(name):
        value = scalar(name)
        return value.decode("utf-8") if isinstance(value, bytes) else str(value or "")

    return Piece(text=text("text_output"), finish_reason=text("finish_reason"),
                 num_output_tokens=int(scalar("num_output_tokens") or 0),
                 total_draft_tokens=int(scalar("total_draft_tokens") or 0),
                 total_accepted_draft_tokens=int(scalar("total_accepted_draft_tokens") or 0),
                 acceptance_rate=float(scalar("acceptance_rate") or 0.0),
                 num_cached_tokens=int(scalar("num_cached_tokens") or 0),
                 num_verify_steps=int(scalar("num_verify_steps") or 0))


def triton_error(message: str) -> APIError:
    """A Triton error response as an OpenAI error: internal failures 500, a full queue 429, else 400.

    The models answer a request's own mistakes with the bare message and prefix their internal
    failures ("generation failed: ..."), which is what tells the two apart here. A message about one input
    ("input 'min_tokens' = 4 is not supported ...") names it as the error's `param`: the Triton inputs the
    gateway sends carry the OpenAI parameters' names.
    """
    if "failed:" in message:
        return server_error(message)
    if "queue" in message.lower():
        return APIError(429, f"The server is busy: {message}", type="rate_limit_error", code="queue_full")
    named = re.search(r"\binput '(\w+)'", message)
    return invalid(message, named.group(1) if named else None)
