"""Prompt preparation for the preprocessing model: optional chat template, then tokenization."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.serving.requests import GenerationRequest, InvalidRequest, RequestLimits, validate_prompt_length

# Values of the `chat_template` parameter besides a literal Jinja template.
NO_TEMPLATE = "none"
MODEL_TEMPLATE = "model"
# The default: the tokenizer's own template when the target ships one, else the text verbatim. An instruct
# model asked a bare question often answers with nothing at all; a base model has no template to apply.
AUTO_TEMPLATE = "auto"


def resolve_chat_template(option: str, tokenizer) -> str:
    """'auto' becomes 'model' or 'none' by what the tokenizer ships; other values stay as they are."""
    if option != AUTO_TEMPLATE:
        return option
    return MODEL_TEMPLATE if getattr(tokenizer, "chat_template", None) else NO_TEMPLATE


@dataclass
class Preprocessor:
    """Turns a validated request into prompt token ids.

    chat_template: "none" feeds text_input verbatim; "model" wraps it as one user message with the
    tokenizer's own template; "auto" is "model" when the tokenizer has a template, else "none"; anything
    else is used as the Jinja template itself.
    """

    tokenizer: object
    limits: RequestLimits
    chat_template: str = NO_TEMPLATE

    def __post_init__(self):
        self.chat_template = resolve_chat_template(self.chat_template, self.tokenizer)
        if self.chat_template == MODEL_TEMPLATE and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("chat_template='model' but the tokenizer has no chat template")

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if self.chat_template == NO_TEMPLATE:
            ids = self.tokenizer.encode(request.text)
        else:
            template = None if self.chat_template == MODEL_TEMPLATE else self.chat_template
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": request.text}],
                chat_template=template,
                add_generation_prompt=True,
                tokenize=True,
            )
            ids = _plain_ids(ids)
        if not ids:
            raise InvalidRequest("text_input produced no tokens")
        validate_prompt_length(len(ids), request.max_tokens, self.limits)
        return [int(i) for i in ids]


def _plain_ids(ids) -> list[int]:
    # Depending on the transformers version apply_chat_template returns a list or a BatchEncoding.
    if hasattr(ids, "keys") and "input_ids" in ids:
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return list(ids)
