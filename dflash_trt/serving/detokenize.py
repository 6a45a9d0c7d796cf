"""Incremental detokenization that survives streaming.

Decoding each streamed chunk on its own loses the leading space of SentencePiece pieces and
splits multi-byte characters (emoji, CJK) whose bytes sit in different byte-level tokens. The
postprocessing model is stateless (every chunk is a separate Triton request), so the state travels
with the chunk: the dflash model sends a *window* made of up to `NUM_CONTEXT_TOKENS` tokens that
were already sent, followed by the new tokens, and the number of context tokens. The text of the
chunk is then

    settled(decode(window)) minus settled(decode(context))

where `settled` drops trailing U+FFFD (an incomplete character that the next token completes)
unless the chunk is the last one. Both decodes start at the same token, so whatever the decoder
does to the start of a sequence (a stripped leading space, a broken leading character) cancels out.
The concatenation of all chunk texts equals decoding all tokens at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A character spans at most 4 byte-level tokens; 8 leaves room for merges around it.
NUM_CONTEXT_TOKENS = 8
_REPLACEMENT = "\ufffd"


def decode(tokenizer, token_ids) -> str:
    return tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def settled(text: str) -> str:
    """Text without a trailing incomplete character (decoded as U+FFFD)."""
    return text.rstrip(_REPLACEMENT)


def decode_chunk(tokenizer, window_ids, num_context_tokens: int, is_final: bool) -> str:
    """Text that the new tokens of `window_ids` add after its first `num_context_tokens` tokens."""
    window_ids = [int(t) for t in window_ids]
    if not 0 <= num_context_tokens <= len(window_ids):
        raise ValueError(f"num_context_tokens={num_context_tokens} outside a window of {len(window_ids)} tokens")
    full = decode(tokenizer, window_ids)
    if not is_final:
        full = settled(full)
    previous = settled(decode(tokenizer, window_ids[:num_context_tokens])) if num_context_tokens else ""
    # `previous` is a prefix of `full` except when a character completed by the new tokens was
    # decoded differently: fall back to the longest common prefix.
    if full.startswith(previous):
        return full[len(previous):]
    common = 0
    for a, b in zip(full, previous):
        if a != b:
            break
        common += 1
    return full[common:]


@dataclass
class ChunkWindow:
    """Sender side: turns newly committed tokens into (window, num_context_tokens) chunks."""

    num_context_tokens: int = NUM_CONTEXT_TOKENS
    token_ids: list[int] = field(default_factory=list)

    def add(self, new_ids) -> tuple[list[int], int]:
        start = max(0, len(self.token_ids) - self.num_context_tokens)
        context = self.token_ids[start:]
        self.token_ids.extend(int(t) for t in new_ids)
        return context + [int(t) for t in new_ids], len(context)


class IncrementalDetokenizer:
    """In-process twin of the dflash -> postprocessing path: feed token chunks, get text deltas."""

    def __init__(self, tokenizer, num_context_tokens: int = NUM_CONTEXT_TOKENS):
        self.tokenizer = tokenizer
        self.window = ChunkWindow(num_context_tokens)

    def add(self, new_ids, is_final: bool = False) -> str:
        window, num_context = self.window.add(new_ids)
        return decode_chunk(self.tokenizer, window, num_context, is_final)
