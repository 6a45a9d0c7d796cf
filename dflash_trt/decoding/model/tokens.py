"""Between text and token ids for a target: its default stop ids, prompt encoding (plain or chat), decoding.

Shared by the commands, serving, benchmarks and training, so each asks the tokenizer the same way.
"""

from __future__ import annotations

from dflash_trt.data.prompts import prompt_messages
from dflash_trt.errors import DFlashError


def default_stop_ids(target) -> list[int]:
    """EOS ids of the target's generation config, else its model config, else its (shipped) tokenizer.

    A model without any of them has no default stop id, as in transformers' `generate`."""
    eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(target.model, "config", None), "eos_token_id", None)
    if eos is None and target.tokenizer is not None:
        eos = target.tokenizer.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def encode_prompt(target, text, chat: bool) -> list[int]:
    """Token ids of a prompt: text, or (with chat) a list of chat messages ending on a user turn."""
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise DFlashError(f"{target.source} has no tokenizer: pass token ids instead of text")
    if chat:
        if not tokenizer.chat_template:
            raise DFlashError(f"{target.source}: the tokenizer has no chat template (drop --chat)")
        try:
            messages = prompt_messages(text)
        except ValueError as error:
            raise DFlashError(str(error)) from None
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if not isinstance(text, str):
        raise DFlashError("a multi-turn prompt (a list of chat messages) needs --chat")
    return tokenizer.encode(text)


def decode_tokens(target, token_ids: list[int]) -> str | None:
    if target.tokenizer is None:
        return None
    return target.tokenizer.decode(token_ids, skip_special_tokens=False)
