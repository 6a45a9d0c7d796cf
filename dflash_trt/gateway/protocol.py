"""Validation of OpenAI request bodies into small dataclasses (no web framework involved).

Unknown keys are refused rather than dropped; keys that OpenAI clients commonly send with their
neutral value (logprobs null, best_of 1, ...) are accepted only with that value, so a request never
silently means something else here than on OpenAI.

The logits controls go to the ensemble's TensorRT-LLM-named tensors and keep TensorRT-LLM's semantics
(dflash_trt/decoding/step/logits_processors.py): `presence_penalty` and `frequency_penalty` (OpenAI's range -2..2) count
the prompt's tokens as well as the generated ones, and are subtracted after the temperature scaling (not
divided by the temperature). OpenAI (and vLLM) count the generated tokens only: a token of the prompt is
penalized here from the first generated token on, there only once it was generated. vLLM's extensions
`min_tokens` (holds back the end-of-sequence tokens only; a stop string still ends the text),
`repetition_penalty` (prompt and output tokens, as in vLLM) and `bad_words` (each string tokenized as given,
as TensorRT-LLM does; vLLM also bans it with a leading space) are accepted too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from dflash_trt.gateway.errors import invalid
from dflash_trt.serving.requests import MAX_WORD_BYTES, MAX_WORDS

MAX_STOP_STRINGS = 4
MAX_SEED = 2**64 - 1  # Triton's seed input is UINT64
# Triton's INT32 inputs: a larger value must be refused here, as Triton's own HTTP front would wrap it
# (max_tokens 2**32 + 8 arrives as 8).
MAX_INT32 = 2**31 - 1
# Keys of a chat message that OpenAI defines and that change nothing for a text-only answer: "name" (a
# participant's name, which chat templates do not use) and empty tool fields.
MESSAGE_KEYS = {"role", "content", "name"}
MESSAGE_NEUTRAL = {"tool_calls": lambda v: not v, "refusal": lambda v: v is None,
                   "function_call": lambda v: v is None, "audio": lambda v: v is None}
ROLES = ("system", "developer", "user", "assistant")
# Accepted only with a neutral value: key -> predicate on the value.
NEUTRAL = {
    "logprobs": lambda v: v in (None, False),
    "top_logprobs": lambda v: v in (None, 0),
    "logit_bias": lambda v: not v,
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: v in (None, ""),
    "tools": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "parallel_tool_calls": lambda v: True,
    "response_format": lambda v: v in (None, {"type": "text"}),
    # OpenAI's bookkeeping and routing fields, meaningless for a self-hosted model.
    "store": lambda v: v in (None, False),
    "metadata": lambda v: v is None or isinstance(v, dict),
    "service_tier": lambda v: v in (None, "auto", "default"),
    "modalities": lambda v: v in (None, ["text"]),
}
COMMON_KEYS = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
               "stream_options", "user", "ignore_eos", "presence_penalty", "frequency_penalty",
               "min_tokens", "repetition_penalty", "bad_words"}
COMPLETION_KEYS = COMMON_KEYS | {"prompt", "echo", "logprobs", "logit_bias", "best_of", "suffix"}
CHAT_KEYS = COMMON_KEYS | {"messages", "max_completion_tokens", "chat_template_kwargs", "logprobs", "top_logprobs",
                           "logit_bias", "tools", "tool_choice", "parallel_tool_calls", "response_format", "store",
                           "metadata", "service_tier", "modalities"}


@dataclass(frozen=True)
class Sampling:
    """Generation settings of one request; max_tokens None means the endpoint's default."""

    max_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (an extension vLLM also accepts)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Keep generating past end-of-sequence tokens, up to max_tokens (an extension vLLM and
    # TensorRT-LLM also accept; benchmarks use it for outputs of a fixed length).
    ignore_eos: bool = False
    # Logits controls (TensorRT-LLM's semantics, see the module docstring); the defaults change nothing.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0  # a vLLM extension, as are the two below
    repetition_penalty: float = 1.0
    bad_words: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    echo: bool = False


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, str]]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise invalid(f"The request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object")
    _check_encodable(body, "")
    return body


def _check_encodable(value, where: str) -> None:
    """JSON's "\\ud800" escapes decode to lone surrogates, which no UTF-8 tokenizer or gRPC string takes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise invalid(f"{where or 'the body'} holds a lone UTF-16 surrogate ({value[error.start]!r} at "
                          f"character {error.start}): not valid Unicode", where.split("[")[0].split(".")[0] or None)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_encodable(key, where)
            _check_encodable(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_encodable(item, f"{where}[{index}]")


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    _check_keys(body, COMPLETION_KEYS)
    stream, include_usage = _stream(body)
    return CompletionRequest(model=_model(body), prompt=_prompt(body.get("prompt")), sampling=_sampling(body),
                             stream=stream, include_usage=include_usage, echo=_bool(body, "echo"))


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    _check_keys(body, CHAT_KEYS)
    stream, include_usage = _stream(body)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs must be an object", "chat_template_kwargs")
    return ChatRequest(model=_model(body), messages=_messages(body.get("messages")), sampling=_sampling(body),
                       stream=stream, include_usage=include_usage, template_kwargs=kwargs)


def _check_keys(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    for key, is_neutral in NEUTRAL.items():
        if key in body and not is_neutral(body[key]):
            raise invalid(f"{key}={json.dumps(body[key])} is not supported by this server", key)
    if body.get("n") not in (None, 1):
        raise invalid(f"n={json.dumps(body['n'])} is not supported: this server returns one choice (n=1)", "n")


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("you must provide a model parameter", "model")
    return model


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise invalid("stream_options supports only include_usage", "stream_options")
    return stream, _bool(options, "include_usage")


def _sampling(body: dict[str, Any]) -> Sampling:
    defaults = Sampling()
    temperature = _number(body, "temperature", defaults.temperature)
    if not 0.0 <= temperature <= 2.0:
        raise invalid(f"temperature must be between 0 and 2, got {temperature}", "temperature")
    top_p = _number(body, "top_p", defaults.top_p)
    if not 0.0 < top_p <= 1.0:
        raise invalid(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = _integer(body, "top_k", defaults.top_k)
    if not 0 <= top_k <= MAX_INT32:
        raise invalid(f"top_k must be in [0, {MAX_INT32}], got {top_k}", "top_k")
    seed = _integer(body, "seed", None)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise invalid(f"seed must be in [0, 2**64), got {seed}", "seed")
    max_tokens = _integer(body, "max_tokens", None)
    if max_tokens is not None and max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if max_tokens is not None and max_tokens > MAX_INT32:  # the model's own limit is lower still (model.py)
        raise invalid(f"max_tokens is too large: {max_tokens}", "max_tokens")
    penalties = {key: _number(body, key, 0.0) for key in ("presence_penalty", "frequency_penalty")}
    for key, value in penalties.items():
        if not -2.0 <= value <= 2.0:
            raise invalid(f"{key} must be between -2 and 2, got {value}", key)
    repetition_penalty = _number(body, "repetition_penalty", defaults.repetition_penalty)
    if repetition_penalty <= 0:
        raise invalid(f"repetition_penalty must be > 0, got {repetition_penalty}", "repetition_penalty")
    min_tokens = _integer(body, "min_tokens", defaults.min_tokens)
    if not 0 <= min_tokens <= MAX_INT32:
        raise invalid(f"min_tokens must be in [0, {MAX_INT32}], got {min_tokens}", "min_tokens")
    if max_tokens is not None and min_tokens > max_tokens:
        raise invalid(f"min_tokens must be at most max_tokens={max_tokens}, got {min_tokens}", "min_tokens")
    return Sampling(max_tokens, temperature, top_p, top_k, seed, _stop(body.get("stop")), _bool(body, "ignore_eos"),
                    min_tokens=min_tokens, repetition_penalty=repetition_penalty, bad_words=_bad_words(body),
                    **penalties)


def _bad_words(body: dict[str, Any]) -> tuple[str, ...]:
    words = body.get("bad_words")
    if words is None:
        return ()
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise invalid("bad_words must be a list of strings", "bad_words")
    if len(words) > MAX_WORDS:
        raise invalid(f"bad_words has {len(words)} entries; at most {MAX_WORDS} are accepted", "bad_words")
    _check_word_sizes(words, "bad_words")
    return tuple(w for w in words if w)


def _check_word_sizes(words: list[str], name: str) -> None:
    for index, word in enumerate(words):
        size = len(word.encode("utf-8"))
        if size > MAX_WORD_BYTES:
            raise invalid(f"{name}[{index}] is {size} bytes; each entry may have at most {MAX_WORD_BYTES}", name)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise invalid("stop must be a string or a list of strings", "stop")
    if len(words) > MAX_STOP_STRINGS:
        raise invalid(f"stop accepts at most {MAX_STOP_STRINGS} strings, got {len(words)}", "stop")
    _check_word_sizes(words, "stop")
    return tuple(w for w in words if w)


def _prompt(value) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise invalid("prompt must not be empty", "prompt")
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        raise invalid("a list of several prompts is not supported: send one prompt per request", "prompt")
    raise invalid("prompt must be a string (token-id prompts are not supported)", "prompt")


def _messages(value) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages must be a non-empty list", "messages")
    return [_message(m, i) for i, m in enumerate(value)]


def _message(message, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"{where} must be an object", "messages")
    unknown = sorted(set(message) - MESSAGE_KEYS - set(MESSAGE_NEUTRAL))
    if unknown:
        raise invalid(f"Unrecognized key(s) in {where}: {', '.join(unknown)}", "messages")
    for key, is_neutral in MESSAGE_NEUTRAL.items():
        if key in message and not is_neutral(message[key]):
            raise invalid(f"{where}.{key} is not supported by this server", "messages")
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role must be one of {', '.join(ROLES)}, got {json.dumps(role)}", "messages")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   and set(p) == {"type", "text"} for p in content):
            raise invalid(f"{where}.content: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise invalid(f"{where}.content must be a string or a list of text parts", "messages")
    # "developer" is OpenAI's new name for "system"; chat templates know only the latter.
    return {"role": "system" if role == "developer" else role, "content": content}


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{key} must be a boolean, got {json.dumps(value)}", key)
    return value


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"{key} must be a number, got {json.dumps(value)}", key)
    return float(value)


def _integer(body: dict[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{key} must be an integer, got {json.dumps(value)}", key)
    return value
