"""Validation of generation requests, independent of Triton (tensors arrive as numpy arrays).

The ensemble keeps TensorRT-LLM's tensor names so that existing clients work unchanged. Every
user mistake becomes an `InvalidRequest` whose message names the tensor and the bad value; the
model turns it into an error response and stays healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_trt.decoding.step.sampling_rules import sampling_problem
from dflash_trt.errors import DFlashError
from dflash_trt.serving.trtllm_inputs import COMPAT_INPUTS, KINDS, unsupported_value

# name -> (numpy dtype kinds accepted, Triton type, required)
INPUTS = {
    "text_input": ("OSU", "TYPE_STRING", True),
    "max_tokens": ("iu", "TYPE_INT32", True),
    "stream": ("b", "TYPE_BOOL", False),
    "temperature": ("f", "TYPE_FP32", False),
    "top_k": ("iu", "TYPE_INT32", False),
    "top_p": ("f", "TYPE_FP32", False),
    "seed": ("iu", "TYPE_UINT64", False),
    "stop_words": ("OSU", "TYPE_STRING", False),
    "end_id": ("iu", "TYPE_INT32", False),
    "exclude_input_in_output": ("b", "TYPE_BOOL", False),
    # TensorRT-LLM's logits controls (dflash_trt/decoding/step/logits_processors.py states what they do).
    "min_tokens": ("iu", "TYPE_INT32", False),
    "bad_words": ("OSU", "TYPE_STRING", False),
    "repetition_penalty": ("f", "TYPE_FP32", False),
    "presence_penalty": ("f", "TYPE_FP32", False),
    "frequency_penalty": ("f", "TYPE_FP32", False),
}
# The preprocessing model (and so the ensemble) also takes TensorRT-LLM's other optional inputs, at their
# neutral values only (trtllm_inputs.py); the dflash model takes INPUTS alone.
TEXT_INPUTS = {**INPUTS, **{name: (KINDS[spec.triton_type], spec.triton_type, False)
                            for name, spec in COMPAT_INPUTS.items()}}
OUTPUTS = {
    "text_output": "TYPE_STRING",
    "num_output_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "num_verify_steps": "TYPE_INT32",  # verify steps so far (not in TensorRT-LLM's): tau = 1 + accepted / steps
    "acceptance_rate": "TYPE_FP32",
    "num_cached_tokens": "TYPE_INT32",  # prompt tokens served from the prefix cache (not in TensorRT-LLM's)
    "finish_reason": "TYPE_STRING",
    # Always 0: TensorRT-LLM's ensemble numbers the rows of a batched request; ours takes one row. Its clients
    # ask for it when they batch their inputs (end_to_end_grpc_client.py --batch-inputs).
    "batch_index": "TYPE_INT32",
}


class InvalidRequest(DFlashError):
    """A request that the model refuses; the message goes back to the client."""


# A prompt is refused by its size in bytes before it is tokenized: tokenizing megabytes takes seconds of
# the preprocessing model (and of every request queued behind it) only to find that it cannot fit. No
# tokenizer we serve puts more than this many bytes in a token on ordinary text, so a prompt longer than
# max_context_tokens x this cannot fit; `dflash-trt repo --max-prompt-bytes` sets another bound.
BYTES_PER_TOKEN_BOUND = 32
# stop_words / bad_words: each word costs a tokenization (bad_words) or a text search per step (stop_words).
MAX_WORDS = 64
MAX_WORD_BYTES = 256


@dataclass(frozen=True)
class RequestLimits:
    """What a deployment accepts; rendered into the model configs by `dflash-trt repo`.

    max_prompt_bytes: the largest text_input in UTF-8 bytes; 0 derives it from max_context_tokens."""

    max_tokens: int = 4096
    max_context_tokens: int = 8192
    max_prompt_bytes: int = 0

    @property
    def prompt_bytes_limit(self) -> int:
        return self.max_prompt_bytes or self.max_context_tokens * BYTES_PER_TOKEN_BOUND


IGNORE_EOS = -1  # the end_id that disables end-of-sequence tokens


def request_end_ids(request: "GenerationRequest", default: tuple[int, ...]) -> tuple[int, ...]:
    """The token ids that end this request's generation: its end_id, none (-1), or the model's."""
    if request.end_id is None:
        return tuple(default)
    return () if request.end_id == IGNORE_EOS else (request.end_id,)


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request. `end_id` None means the model's own end-of-sequence tokens; -1 means none
    (generate until max_tokens or a stop word: TensorRT-LLM's spelling of ignore_eos). min_tokens holds the
    end ids back until that many tokens were generated; bad_words are strings never to emit (each tokenized
    without special tokens, as TensorRT-LLM's preprocessing does); the penalties are TensorRT-LLM's
    (dflash_trt/decoding/step/logits_processors.py)."""

    text: str
    max_tokens: int
    stream: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    end_id: int | None = None
    exclude_input_in_output: bool = False
    min_tokens: int = 0
    bad_words: tuple[str, ...] = ()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


def parse_request(arrays: dict[str, np.ndarray | None], limits: RequestLimits,
                  with_text: bool = True) -> GenerationRequest:
    """Validate the ensemble's inputs (absent optional inputs map to None or are missing).

    with_text=False validates everything but text_input (the dflash model gets token ids instead).
    """
    inputs = TEXT_INPUTS if with_text else {k: v for k, v in INPUTS.items() if k != "text_input"}
    unknown = sorted(set(arrays) - set(inputs) - {"input_ids"})
    if unknown:
        raise InvalidRequest(f"unknown input tensor(s): {', '.join(unknown)}")
    for name, (kinds, triton_type, required) in inputs.items():
        array = arrays.get(name)
        if array is None:
            if required:
                raise InvalidRequest(f"missing required input '{name}'")
            continue
        if np.asarray(array).dtype.kind not in kinds:
            raise InvalidRequest(f"input '{name}' must be {triton_type[5:]}, got {np.asarray(array).dtype}")
    for name in sorted(COMPAT_INPUTS.keys() & arrays.keys()):
        message = unsupported_value(name, arrays[name]) if arrays[name] is not None else None
        if message:
            raise InvalidRequest(message)
    text = ""
    if with_text:
        raw = scalar(arrays, "text_input")
        check_prompt_size(raw, limits)
        text = decode_text(raw, "text_input")
        if not text.strip():
            raise InvalidRequest("text_input is empty")
    request = GenerationRequest(
        text=text,
        max_tokens=int(scalar(arrays, "max_tokens")),
        stream=bool(scalar(arrays, "stream", False)),
        temperature=float(scalar(arrays, "temperature", 0.0)),
        top_k=int(scalar(arrays, "top_k", 0)),
        top_p=float(scalar(arrays, "top_p", 1.0)),
        seed=_optional_int(scalar(arrays, "seed", None)),
        stop_words=parse_words(arrays.get("stop_words"), "stop_words"),
        end_id=_optional_int(scalar(arrays, "end_id", None)),
        exclude_input_in_output=bool(scalar(arrays, "exclude_input_in_output", False)),
        min_tokens=int(scalar(arrays, "min_tokens", 0)),
        bad_words=parse_words(arrays.get("bad_words"), "bad_words"),
        repetition_penalty=float(scalar(arrays, "repetition_penalty", 1.0)),
        presence_penalty=float(scalar(arrays, "presence_penalty", 0.0)),
        frequency_penalty=float(scalar(arrays, "frequency_penalty", 0.0)),
    )
    validate_sampling(request, limits)
    return request


def parse_token_request(arrays: dict[str, np.ndarray], limits: RequestLimits,
                        vocab_size: int | None = None) -> tuple[GenerationRequest, list[int]]:
    """The dflash model's inputs: prompt token ids (`input_ids`) plus the generation parameters."""
    ids = arrays.get("input_ids")
    if ids is None:
        raise InvalidRequest("missing required input 'input_ids'")
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise InvalidRequest(f"input 'input_ids' must be INT32, got {ids.dtype}")
    if ids.size > limits.max_context_tokens:  # before any per-id work on a huge list
        raise InvalidRequest(f"input_ids has {ids.size} tokens; the model's context is {limits.max_context_tokens}")
    prompt_ids = [int(i) for i in ids.reshape(-1)]
    if not prompt_ids:
        raise InvalidRequest("input_ids is empty")
    if vocab_size is not None and not all(0 <= i < vocab_size for i in prompt_ids):
        raise InvalidRequest(f"input_ids must be in [0, {vocab_size})")
    request = parse_request(arrays, limits, with_text=False)
    if vocab_size is not None and request.end_id is not None and request.end_id >= vocab_size:
        raise InvalidRequest(f"end_id {request.end_id} is outside the vocabulary [0, {vocab_size}) "
                             "(-1 ignores end-of-sequence)")
    validate_prompt_length(len(prompt_ids), request.max_tokens, limits)
    return request, prompt_ids


def validate_sampling(request: GenerationRequest, limits: RequestLimits) -> None:
    if not 1 <= request.max_tokens <= limits.max_tokens:
        raise InvalidRequest(f"max_tokens must be in [1, {limits.max_tokens}], got {request.max_tokens}")
    if request.end_id is not None and request.end_id < IGNORE_EOS:
        raise InvalidRequest(f"end_id must be >= 0, or -1 to ignore end-of-sequence, got {request.end_id}")
    # The decoding loop's own rules (SamplingParams), refused here as a 400 before the request is queued.
    problem = sampling_problem(float(request.temperature), int(request.top_k), float(request.top_p),
                               int(request.min_tokens), float(request.repetition_penalty),
                               float(request.presence_penalty), float(request.frequency_penalty))
    if problem:
        raise InvalidRequest(problem)


def validate_prompt_length(num_prompt_tokens: int, max_tokens: int, limits: RequestLimits) -> None:
    if num_prompt_tokens + max_tokens > limits.max_context_tokens:
        raise InvalidRequest(
            f"prompt of {num_prompt_tokens} tokens plus max_tokens={max_tokens} exceeds the model's "
            f"context of {limits.max_context_tokens} tokens"
        )


def scalar(arrays: dict, name: str, default=None):
    """The single element of an input of shape [1] (or [1, 1] with a batch dimension)."""
    array = arrays.get(name)
    if array is None:
        return default
    flat = np.asarray(array).reshape(-1)
    if flat.size != 1:
        raise InvalidRequest(f"input '{name}' must hold exactly one element, got shape {list(np.shape(array))}")
    return flat[0].item() if hasattr(flat[0], "item") else flat[0]


def decode_text(value, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequest(f"{name} is not valid UTF-8 (byte {error.start})") from None
    return str(value)


def check_prompt_size(value, limits: RequestLimits) -> None:
    """Refuse a text_input longer than the byte limit, before anything costly is done with it."""
    size = len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8", "surrogatepass"))
    if size > limits.prompt_bytes_limit:
        raise InvalidRequest(f"text_input is {size} bytes; this server accepts at most {limits.prompt_bytes_limit} "
                             f"bytes (max_prompt_bytes; the context is {limits.max_context_tokens} tokens)")


def parse_words(array, name: str) -> tuple[str, ...]:
    """A list-of-strings input (stop_words, bad_words): its non-empty strings, at most MAX_WORDS of at most
    MAX_WORD_BYTES bytes each."""
    if array is None:
        return ()
    values = np.asarray(array, dtype=object).reshape(-1)
    if values.size > MAX_WORDS:
        raise InvalidRequest(f"{name} has {values.size} entries; at most {MAX_WORDS} are accepted")
    for index, value in enumerate(values):
        size = len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8", "surrogatepass"))
        if size > MAX_WORD_BYTES:
            raise InvalidRequest(f"{name}[{index}] is {size} bytes; each entry may have at most {MAX_WORD_BYTES}")
    words = tuple(decode_text(v, name) for v in values)
    return tuple(w for w in words if w)


def check_parameters(parameters: dict) -> None:
    """Refuse request parameters: Triton's /generate turns every JSON field that is not an input into one, so a
    misspelt input ("max_token", "temprature") would otherwise be dropped without a word."""
    if not parameters:
        return
    import difflib

    hints = []
    for name in sorted(parameters):
        close = difflib.get_close_matches(name, TEXT_INPUTS, n=1)
        hints.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    raise InvalidRequest(f"unknown field(s) {', '.join(hints)}: not an input of this model")


def _optional_int(value):
    return None if value is None else int(value)
