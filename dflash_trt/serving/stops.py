"""Stop words matched on text, with the text that may start a stop word held back.

A stop word rarely aligns with token boundaries ("User:" can be two tokens, "\\n\\n" can be merged
with the token before it). The matcher decodes the tokens that were not released yet, releases
those whose text cannot be the start of a stop word, and on a match releases only the tokens
that lie before it: the output ends before the token in which the stop word begins.
"""

from __future__ import annotations

from dflash_trt.serving.detokenize import NUM_CONTEXT_TOKENS, decode_chunk, settled
from dflash_trt.serving.requests import InvalidRequest


class StopMatcher:
    """Feed committed tokens one at a time; `push` returns the tokens that are safe to send."""

    def __init__(self, tokenizer, stop_words):
        self.tokenizer = tokenizer
        self.stop_words = tuple(w for w in stop_words if w)
        if self.stop_words and tokenizer is None:
            raise InvalidRequest("stop_words are text, and the target has no tokenizer: stop on end_id instead")
        self._released: list[int] = []
        self._pending: list[int] = []
        self.stopped = False
        self.stop_word = ""  # the stop word found (the one that starts first)

    def push(self, token_id: int) -> list[int]:
        if self.stopped:
            raise RuntimeError("push after a stop word was found")
        self._pending.append(int(token_id))
        if not self.stop_words:
            return self._release(len(self._pending))
        text = self._pending_text(len(self._pending))
        hits = [(i, word) for word, i in ((w, text.find(w)) for w in self.stop_words) if i >= 0]
        if hits:
            self.stopped = True
            start, self.stop_word = min(hits)
            return self._release(self._tokens_before(start))
        incomplete = len(text) - len(settled(text))  # bytes of a character still to come
        return self._release(self._tokens_before(len(text) - max(incomplete, self._held_chars(text))))

    def flush(self) -> list[int]:
        """At the end of generation (no stop word found): everything still held back."""
        return self._release(len(self._pending))

    def _pending_text(self, count: int) -> str:
        context = self._released[-NUM_CONTEXT_TOKENS:]
        return decode_chunk(self.tokenizer, context + self._pending[:count], len(context), is_final=True)

    def _tokens_before(self, num_chars: int) -> int:
        """Largest number of pending tokens whose text fits in the first `num_chars` characters."""
        count = 0
        for n in range(1, len(self._pending) + 1):
            if len(self._pending_text(n)) > num_chars:
                break
            count = n
        return count

    def _held_chars(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop word."""
        longest = 0
        for word in self.stop_words:
            for size in range(min(len(word) - 1, len(text)), longest, -1):
                if text.endswith(word[:size]):
                    longest = size
                    break
        return longest

    def _release(self, count: int) -> list[int]:
        out, self._pending = self._pending[:count], self._pending[count:]
        self._released.extend(out)
        return out
