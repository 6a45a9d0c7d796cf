"""Chat messages -> prompt text with the target's chat template, and prompt token counts.

The gateway sends text to the ensemble, whose preprocessing model tokenizes it with
`tokenizer.encode` (special tokens added). Counting here uses the same call, so `usage` matches
what the model saw. A template that writes the BOS token itself would get a second one from
`encode`; the rendered text drops its leading BOS when the tokenizer adds one anyway.
"""

from __future__ import annotations

from typing import Any

from dflash_trt.gateway.errors import invalid


class PromptFormatter:
    """Chat templating and token counting with the target's tokenizer."""

    def __init__(self, tokenizer, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None) or None
        self._adds_bos = _adds_bos(tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def chat_prompt(self, messages: list[dict[str, str]], template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text for `messages`, ending with the assistant's turn header."""
        if not self.has_chat_template:
            raise invalid("This model has no chat template: use /v1/completions, or start the gateway with "
                          "--chat-template FILE", "messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                      add_generation_prompt=True, **(template_kwargs or {}))
        except Exception as error:  # noqa: BLE001 - a template may raise anything (jinja's raise_exception)
            raise invalid(f"the chat template rejected the messages: {error}", "messages") from None
        bos = getattr(self.tokenizer, "bos_token", None)
        if self._adds_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


def _adds_bos(tokenizer) -> bool:
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    ids = tokenizer.encode("a")
    return bool(ids) and ids[0] == bos_id
