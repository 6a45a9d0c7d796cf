"""NVIDIA's current Triton contract for TensorRT-LLM, the `tensorrt_llm` model: text in, text out.

NVIDIA serves LLM-API models as one Python model named `tensorrt_llm` (NVIDIA/TensorRT-LLM
triton_backend/all_models/llmapi/tensorrt_llm). Its clients (triton_backend/tools/llmapi_client.py,
end_to_end_test.py --test-llmapi) send `text_input`, optionally `streaming` and the LLM API's sampling
parameters as `sampling_param_<name>` tensors, and read `text_output`; a request with `stop` = true and the
request id of a running request cancels it. This module is that contract on top of the `dflash` model:
it validates a request, says what to ask the dflash model, and turns the dflash model's chunks into the
contract's responses. Threads and Triton objects live in llmapi_service.py.

Defaults are the LLM API's: max_tokens 32, greedy unless a temperature is sent, the prompt echoed in a
non-streamed answer unless `sampling_param_exclude_input_from_output` (NVIDIA's model passes false when the
client leaves it out), finish_reason / stop_reason only when `return_finish_reason` / `return_stop_reason`
ask for them, acceptance and timing figures only with `sampling_param_return_perf_metrics`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

from dflash_trt.serving.detokenize import decode_chunk
from dflash_trt.serving.postprocess import postprocess
from dflash_trt.serving.requests import (GenerationRequest, InvalidRequest, RequestLimits, decode_text, parse_words,
                                         scalar, validate_sampling)
from dflash_trt.serving.triton_io import string_array

# NVIDIA's names and types (config.pbtxt of its llmapi model). Not declared, so Triton refuses them naming
# the tensor: image_url (multimodal), lora_* (adapters), sampling_param_logits_post_processor_name.
INPUTS = {
    "text_input": "TYPE_STRING",
    "streaming": "TYPE_BOOL",
    "sampling_param_best_of": "TYPE_INT32",
    "sampling_param_temperature": "TYPE_FP32",
    "sampling_param_top_k": "TYPE_INT32",
    "sampling_param_top_p": "TYPE_FP32",
    "sampling_param_frequency_penalty": "TYPE_FP32",
    "sampling_param_presence_penalty": "TYPE_FP32",
    "sampling_param_max_tokens": "TYPE_INT32",
    "sampling_param_stop": "TYPE_STRING",
    "sampling_param_seed": "TYPE_UINT64",
    "sampling_param_exclude_input_from_output": "TYPE_BOOL",
    "sampling_param_return_perf_metrics": "TYPE_BOOL",
    "return_finish_reason": "TYPE_BOOL",
    "return_stop_reason": "TYPE_BOOL",
    "return_cumulative_logprob": "TYPE_BOOL",
    "stop": "TYPE_BOOL",
}
# What the model sends. NVIDIA's also declares cumulative_logprob and kv_cache_* block counts, which DFlash
# serving does not compute: they are not declared, so a client that asks for them is told by Triton.
OUTPUTS = {
    "text_output": "TYPE_STRING",
    "finish_reason": "TYPE_STRING",
    "stop_reason": "TYPE_STRING",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
}
DEFAULT_MAX_TOKENS = 32  # the LLM API's SamplingParams default
# The ensemble's field names in validation messages -> this contract's tensor names.
_NAMES = {"max_tokens": "sampling_param_max_tokens", "temperature": "sampling_param_temperature",
          "top_k": "sampling_param_top_k", "top_p": "sampling_param_top_p",
          "presence_penalty": "sampling_param_presence_penalty",
          "frequency_penalty": "sampling_param_frequency_penalty"}


@dataclass(frozen=True)
class LlmApiRequest:
    """One validated `tensorrt_llm` request: the generation (ensemble semantics) and what to return."""

    generation: GenerationRequest
    streaming: bool = False
    return_perf_metrics: bool = False
    return_finish_reason: bool = False
    return_stop_reason: bool = False


def is_stop_request(arrays: dict[str, np.ndarray]) -> bool:
    """A request that cancels the running request with its id (NVIDIA's `stop` input)."""
    return bool(scalar(arrays, "stop", False))


def parse_llmapi_request(arrays: dict[str, np.ndarray], limits: RequestLimits, decoupled: bool) -> LlmApiRequest:
    """Validate a request; every refusal names the tensor (InvalidRequest)."""
    text_input = arrays.get("text_input")
    if text_input is None:
        raise InvalidRequest("missing required input 'text_input'")
    if np.asarray(text_input).ndim != 1 or np.asarray(text_input).size != 1:
        raise InvalidRequest(f"input 'text_input' must hold one prompt (shape [1]), got shape "
                             f"{list(np.shape(text_input))}")
    text = decode_text(np.asarray(text_input).reshape(-1)[0], "text_input")
    if not text.strip():
        raise InvalidRequest("text_input is empty")
    streaming = bool(scalar(arrays, "streaming", False))
    if streaming and not decoupled:
        raise InvalidRequest("input 'streaming' = true needs the decoupled tensorrt_llm model: render the "
                             "repository with `dflash-trt repo --tensorrt-llm-decoupled` (as NVIDIA's model.yaml "
                             "sets triton_config.decoupled), or send streaming = false")
    best_of = scalar(arrays, "sampling_param_best_of", 1)
    if int(best_of) != 1:
        raise InvalidRequest(f"input 'sampling_param_best_of' = {best_of} is not supported by DFlash serving; "
                             "send 1 (one sequence per request) or leave it out")
    if scalar(arrays, "return_cumulative_logprob", False):
        raise InvalidRequest("input 'return_cumulative_logprob' = true is not supported by DFlash serving (log "
                             "probabilities are not computed); send false or leave it out")
    seed = scalar(arrays, "sampling_param_seed", None)
    generation = GenerationRequest(
        text=text,
        max_tokens=int(scalar(arrays, "sampling_param_max_tokens", min(DEFAULT_MAX_TOKENS, limits.max_tokens))),
        stream=streaming,
        temperature=float(scalar(arrays, "sampling_param_temperature", 0.0)),
        top_k=int(scalar(arrays, "sampling_param_top_k", 0)),
        top_p=float(scalar(arrays, "sampling_param_top_p", 1.0)),
        seed=None if seed is None else int(seed),
        stop_words=parse_words(arrays.get("sampling_param_stop"), "sampling_param_stop"),
        exclude_input_in_output=bool(scalar(arrays, "sampling_param_exclude_input_from_output", False)),
        presence_penalty=float(scalar(arrays, "sampling_param_presence_penalty", 0.0)),
        frequency_penalty=float(scalar(arrays, "sampling_param_frequency_penalty", 0.0)),
    )
    try:
        validate_sampling(generation, limits)
    except InvalidRequest as error:
        raise InvalidRequest(_contract_names(str(error))) from None
    return LlmApiRequest(generation, streaming,
                         return_perf_metrics=bool(scalar(arrays, "sampling_param_return_perf_metrics", False)),
                         return_finish_reason=bool(scalar(arrays, "return_finish_reason", False)),
                         return_stop_reason=bool(scalar(arrays, "return_stop_reason", False)))


def _contract_names(message: str) -> str:
    return re.sub(r"\b(" + "|".join(_NAMES) + r")\b", lambda match: _NAMES[match.group(1)], message)


def dflash_inputs(request: LlmApiRequest, prompt_ids: list[int]) -> dict[str, np.ndarray]:
    """The dflash model's inputs for a request. Always streamed: every decoding step answers, so the
    generation id (for cancellation) is known from the first step on, and a cancellation is seen
    within one step; a non-streamed answer is assembled here."""
    gen = request.generation
    arrays = {
        "input_ids": np.array(prompt_ids, dtype=np.int32),
        "max_tokens": np.array([gen.max_tokens], dtype=np.int32),
        "stream": np.array([True]),
        "temperature": np.array([gen.temperature], dtype=np.float32),
        "top_k": np.array([gen.top_k], dtype=np.int32),
        "top_p": np.array([gen.top_p], dtype=np.float32),
        "presence_penalty": np.array([gen.presence_penalty], dtype=np.float32),
        "frequency_penalty": np.array([gen.frequency_penalty], dtype=np.float32),
    }
    if gen.seed is not None:
        arrays["seed"] = np.array([gen.seed], dtype=np.uint64)
    if gen.stop_words:
        arrays["stop_words"] = string_array(gen.stop_words)
    return arrays


@dataclass
class Answer:
    """Turns the dflash model's chunks for one request into `tensorrt_llm` responses.

    push(chunk arrays) returns the outputs of the response to send now, or None (a non-streamed answer
    goes out once, with the final chunk). The text of a streamed chunk is what the ensemble's
    postprocessing gives for it; a non-streamed answer is decoded whole, with the prompt's ids in front
    unless the request excludes them, as the ensemble's non-streamed answer is.
    """

    request: LlmApiRequest
    tokenizer: object
    prompt_ids: list[int]
    arrival_time_ns: int = field(default_factory=time.monotonic_ns)
    scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False

    def scheduled(self) -> None:
        self.scheduled_time_ns = time.monotonic_ns()

    def push(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        window = np.asarray(chunk["output_ids"]).reshape(-1).tolist()
        new_ids = window[int(scalar(chunk, "num_context_tokens")):]
        if new_ids:
            self.last_token_time_ns = time.monotonic_ns()
            self.first_token_time_ns = self.first_token_time_ns or self.last_token_time_ns
        self.token_ids += new_ids
        finish_reason = decode_text(scalar(chunk, "finish_reason"), "finish_reason")
        self.finished = bool(finish_reason)
        if self.request.streaming:
            text = postprocess(self.tokenizer, chunk)["text_output"].reshape(-1)[0].decode("utf-8")
        elif self.finished:
            prefix = [] if self.request.generation.exclude_input_in_output else list(self.prompt_ids)
            text = decode_chunk(self.tokenizer, prefix + self.token_ids, 0, is_final=True)
        else:
            return None
        return self._outputs(text, finish_reason, chunk)

    def _outputs(self, text: str, finish_reason: str, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = {"text_output": string_array([text])}
        # The LLM API's values: finish_reason None until the end; stop_reason the stop string that ended the
        # answer, None otherwise (end-of-sequence ids included, as the LLM API reports them).
        if self.request.return_finish_reason:
            outputs["finish_reason"] = string_array([finish_reason or "None"])
        if self.request.return_stop_reason:
            stop_word = decode_text(scalar(chunk, "stop_reason"), "stop_reason") if "stop_reason" in chunk else ""
            outputs["stop_reason"] = string_array([stop_word or "None"])
        if self.request.return_perf_metrics:
            for name, value in (("arrival_time_ns", self.arrival_time_ns),
                                ("first_scheduled_time_ns", self.scheduled_time_ns),
                                ("first_token_time_ns", self.first_token_time_ns),
                                ("last_token_time_ns", self.last_token_time_ns)):
                outputs[name] = np.array([value], dtype=np.int64)
            outputs["acceptance_rate"] = np.asarray(chunk["acceptance_rate"], dtype=np.float32).reshape(1)
            for name in ("total_accepted_draft_tokens", "total_draft_tokens"):
                outputs[name] = np.asarray(chunk[name], dtype=np.int32).reshape(1)
        return outputs
