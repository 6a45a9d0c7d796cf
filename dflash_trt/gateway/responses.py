"""OpenAI response objects and server-sent-event chunks, plus the DFlash extension field.

`dflash` (top level of a response, and of the last streamed chunks) carries the speculative
decoding figures of the request: tau (mean tokens committed per verify step), num_draft_tokens,
num_accepted_draft_tokens, num_verify_steps and acceptance_rate (accepted / drafted).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from dflash_trt.gateway.triton import Piece

DONE = "data: [DONE]\n\n"
FINISH_REASONS = {"stop": "stop", "length": "length"}


@dataclass
class Reply:
    """Identity of one response: the same id and creation time on every chunk."""

    kind: str  # "completion" or "chat"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        if not self.id:
            self.id = ("cmpl-" if self.kind == "completion" else "chatcmpl-") + uuid.uuid4().hex

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion"

    def head(self, chunk: bool = False) -> dict[str, Any]:
        name = self.object + (".chunk" if chunk and self.kind == "chat" else "")
        return {"id": self.id, "object": name, "created": self.created, "model": self.model}


def finish_reason(piece: Piece) -> str:
    return FINISH_REASONS.get(piece.finish_reason, piece.finish_reason)


def usage(num_prompt_tokens: int, piece: Piece) -> dict[str, Any]:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: prompt tokens the server's prefix cache held."""
    completion = piece.num_output_tokens
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": completion,
            "total_tokens": num_prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": piece.num_cached_tokens}}


def dflash_stats(piece: Piece, block_size: int) -> dict[str, Any]:
    """The extension field. tau counts the server's verify steps (num_verify_steps); a server that does not report
    them is taken to draft block_size - 1 tokens every step, which the budget policy (plain steps, shorter chains,
    trees) does not."""
    drafts, accepted = piece.total_draft_tokens, piece.total_accepted_draft_tokens
    steps = piece.num_verify_steps or (drafts / (block_size - 1) if block_size > 1 else 0)
    return {"tau": round(1 + accepted / steps, 4) if steps else 0.0, "num_draft_tokens": drafts,
            "num_accepted_draft_tokens": accepted, "num_verify_steps": round(steps),
            "acceptance_rate": round(piece.acceptance_rate, 4),
            "block_size": block_size}


def full_response(reply: Reply, text: str, last: Piece, num_prompt_tokens: int, block_size: int) -> dict[str, Any]:
    """The non-streaming answer: one choice with the whole text."""
    if reply.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(last)}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason(last)}
    return {**reply.head(), "choices": [choice], "usage": usage(num_prompt_tokens, last),
            "dflash": dflash_stats(last, block_size)}


def first_chunk(reply: Reply) -> dict[str, Any] | None:
    """Chat streams open with the assistant's role, as OpenAI's do; completions have no such chunk."""
    if reply.kind != "chat":
        return None
    return {**reply.head(chunk=True),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}]}


def text_chunk(reply: Reply, text: str) -> dict[str, Any]:
    return {**reply.head(chunk=True), "choices": [_chunk_choice(reply, text, None)]}


def final_chunk(reply: Reply, last: Piece, block_size: int) -> dict[str, Any]:
    """The chunk that carries finish_reason (and the text of the last piece, if any)."""
    return {**reply.head(chunk=True), "choices": [_chunk_choice(reply, last.text, finish_reason(last))],
            "dflash": dflash_stats(last, block_size)}


def usage_chunk(reply: Reply, last: Piece, num_prompt_tokens: int, block_size: int) -> dict[str, Any]:
    """stream_options.include_usage: a last chunk with no choices and the usage."""
    return {**reply.head(chunk=True), "choices": [], "usage": usage(num_prompt_tokens, last),
            "dflash": dflash_stats(last, block_size)}


def _chunk_choice(reply: Reply, text: str, reason: str | None) -> dict[str, Any]:
    if reply.kind == "completion":
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    delta = {"content": text} if text else {}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def model_list(name: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(name, created)]}


def model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "dflash-trt"}
