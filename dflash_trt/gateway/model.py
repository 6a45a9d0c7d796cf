"""What the gateway serves: one model name, its tokenizer and the limits of the Triton repository.

Everything is read from the running server: the `preprocessing` model's config names the engine
directory (tokenizer, manifest) and the max_tokens / context limits the repository was rendered with.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.gateway.errors import invalid
from dflash_trt.gateway.prompts import PromptFormatter
from dflash_trt.gateway.triton import ENSEMBLE
from dflash_trt.serving.preprocess import resolve_chat_template
from dflash_trt.serving.requests import RequestLimits

PREPROCESSING = "preprocessing"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class GatewayConfig:
    """How `dflash-trt openai` runs; None means: read it from the Triton repository."""

    triton_grpc: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    port: int = 9000
    served_model_name: str | None = None
    engine_dir: Path | None = None  # where the tokenizer and manifest are, as this process sees them
    chat_template: Path | None = None  # a Jinja file replacing the tokenizer's chat template
    ensemble: str = ENSEMBLE
    ready_timeout_s: float = 300.0
    # The model-aware readiness of `dflash-trt serve` (its /health/ready); /health asks it first, since Triton's
    # own readiness stays true when a model process died. None: Triton's only.
    server_health_url: str | None = None
    # Clients must send `Authorization: Bearer <api_key>` on /v1 routes; None: no key is asked for.
    api_key: str | None = None


@dataclass
class ServedModel:
    name: str
    formatter: PromptFormatter
    max_tokens_limit: int
    max_context_tokens: int
    block_size: int
    max_prompt_bytes: int = 0  # the repository's preprocessing limit; 0: derived from the context, as there
    created: int = field(default_factory=lambda: int(time.time()))
    # The repository's preprocessing wraps every text_input as one user message (`repo --chat-template
    # auto|model|FILE`; auto is the default and templates when the tokenizer has one): then only such chats
    # can be served, and no raw completions.
    is_templated_by_triton: bool = False

    def chat_prompt(self, messages: list[dict[str, str]], template_kwargs: dict) -> tuple[str, str]:
        """(text to send to Triton, the prompt it becomes) for a chat request."""
        templated = self.formatter.chat_prompt(messages, template_kwargs)
        if not self.is_templated_by_triton:
            return templated, templated
        if len(messages) != 1 or messages[0]["role"] != "user" or template_kwargs:
            raise invalid("This server's Triton repository applies the chat template itself, to one user message: "
                          "send a single user message (or re-render the repository with `--chat-template none`)",
                          "messages")
        return messages[0]["content"], templated

    def completion_prompt(self, prompt: str) -> str:
        if self.is_templated_by_triton:
            raise invalid("This server's Triton repository wraps every prompt in the chat template: use "
                          "/v1/chat/completions (or re-render the repository with `--chat-template none`)", "prompt")
        return prompt

    @property
    def prompt_bytes_limit(self) -> int:
        return RequestLimits(max_context_tokens=self.max_context_tokens,
                             max_prompt_bytes=self.max_prompt_bytes).prompt_bytes_limit

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: room for a prompt at the limit written with JSON escapes (up to 6
        bytes a character) plus the other fields."""
        return 6 * self.prompt_bytes_limit + 2**20

    def check_prompt_size(self, prompt: str, param: str) -> None:
        """Refuse a prompt over the repository's byte limit before it is tokenized (as preprocessing would)."""
        size = len(prompt.encode("utf-8"))
        if size > self.prompt_bytes_limit:
            raise invalid(f"The text of the {param} is {size} bytes; this server accepts at most "
                          f"{self.prompt_bytes_limit} bytes (its context is {self.max_context_tokens} tokens)", param,
                          "context_length_exceeded")

    def max_tokens(self, requested: int | None, num_prompt_tokens: int, default: int | None, param: str) -> int:
        """The max_tokens to send: the request's (checked against the limits) or the endpoint's default."""
        room = self.max_context_tokens - num_prompt_tokens
        if room < 1:
            raise invalid(f"This model's maximum context length is {self.max_context_tokens} tokens, and the "
                          f"{param} has {num_prompt_tokens} tokens", param, "context_length_exceeded")
        if requested is None:
            return min(default or self.max_tokens_limit, self.max_tokens_limit, room)
        if requested > self.max_tokens_limit:
            raise invalid(f"max_tokens is too large: {requested}. This model supports at most "
                          f"{self.max_tokens_limit} completion tokens", "max_tokens")
        if requested > room:
            raise invalid(f"This model's maximum context length is {self.max_context_tokens} tokens. However, you "
                          f"requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the {param}, "
                          f"{requested} for the completion)", "max_tokens", "context_length_exceeded")
        return requested


def wait_for_triton(config: GatewayConfig, log=print):
    """A synchronous gRPC client once Triton and the ensemble are ready (DFlashError after the timeout)."""
    from tritonclient.grpc import InferenceServerClient

    client = InferenceServerClient(config.triton_grpc)
    deadline = time.monotonic() + config.ready_timeout_s
    announced = False
    while True:
        try:
            if client.is_server_ready() and client.is_model_ready(config.ensemble):
                return client
        except Exception:  # noqa: BLE001 - not reachable yet
            pass
        if time.monotonic() > deadline:
            raise DFlashError(f"Triton at {config.triton_grpc} is not ready with model '{config.ensemble}' after "
                              f"{config.ready_timeout_s:.0f} s")
        if not announced:
            log(f"waiting for Triton at {config.triton_grpc} ...")
            announced = True
        time.sleep(0.5)


def load_served_model(config: GatewayConfig, client) -> ServedModel:
    """Read the repository's settings from Triton and load the target's tokenizer."""
    from dflash_trt.serving.tokenizers import tokenizer_for

    config_json = client.get_model_config(PREPROCESSING, as_json=True)
    params = {k: v.get("string_value", "") for k, v in config_json.get("config", config_json)
              .get("parameters", {}).items()}
    engine_dir = config.engine_dir or params.get("engine_dir")
    if not engine_dir:
        raise DFlashError("the preprocessing model names no engine_dir: pass --engine")
    tokenizer, engine = tokenizer_for(engine_dir)
    # "auto" (the default of `dflash-trt repo`) templates in preprocessing whenever the tokenizer has one.
    repo_template = resolve_chat_template(params.get("chat_template") or "none", tokenizer)
    if repo_template != "none" and config.chat_template:
        raise DFlashError("--chat-template: the repository's preprocessing already applies its own chat template; "
                          "render it with `dflash-trt repo --chat-template none` to use this one")
    chat_template = Path(config.chat_template).read_text() if config.chat_template else None
    if repo_template not in ("none", "model"):
        chat_template = repo_template  # a Jinja template rendered into the repository
    return ServedModel(
        name=config.served_model_name or engine.manifest.get("name") or Path(engine_dir).name,
        formatter=PromptFormatter(tokenizer, chat_template),
        max_tokens_limit=_int_param(params, "max_tokens_limit"),
        max_context_tokens=_int_param(params, "max_context_tokens"),
        block_size=int(engine.block_size),
        max_prompt_bytes=int(params.get("max_prompt_bytes") or 0),  # absent in repositories rendered before it
        is_templated_by_triton=repo_template != "none",
    )


def _int_param(params: dict[str, str], name: str) -> int:
    try:
        return int(params[name])
    except (KeyError, ValueError):
        raise DFlashError(f"the preprocessing model's parameter {name} is missing or not an integer") from None
