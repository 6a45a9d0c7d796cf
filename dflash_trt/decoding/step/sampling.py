"""Sampling parameters and how the target's verify logits become token choices.

Verification draws every block position from the target's own (temperature, top-k, top-p adjusted)
distribution; a draft token is accepted only on exact match. With a one-hot (argmax) draft this is exact
speculative sampling, so every emitted token is a target sample given the emitted prefix.

min_tokens, bad_words_ids and the repetition / presence / frequency penalties adjust the target's logits
before that choice (logits_processors.py, which states their semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.step.sampling_rules import sampling_problem
from dflash_trt.errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. temperature 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1.0 = no nucleus filter
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # Logits processors (logits_processors.py); the defaults leave the logits untouched.
    min_tokens: int = 0  # the stop tokens are masked until this many tokens were generated
    bad_words_ids: tuple[tuple[int, ...], ...] = field(default_factory=tuple)  # token sequences never emitted
    repetition_penalty: float = 1.0  # > 0; 1.0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self):
        if self.max_new_tokens <= 0:
            raise DFlashError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        problem = sampling_problem(self.temperature, self.top_k, self.top_p, self.min_tokens,
                                   self.repetition_penalty, self.presence_penalty, self.frequency_penalty)
        if problem:
            raise DFlashError(problem)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        words = tuple(tuple(int(t) for t in word) for word in self.bad_words_ids)
        if any(not word or min(word) < 0 for word in words):
            raise DFlashError(f"bad_words_ids must be non-empty sequences of token ids >= 0, got {list(words)}")
        object.__setattr__(self, "bad_words_ids", words)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def has_logits_processors(self) -> bool:
        """Whether any logits processor changes this request's logits (else they are used as they are)."""
        return bool(self.has_penalties or self.bad_words_ids or (self.min_tokens > 0 and self.stop_token_ids))

    def make_generator(self) -> torch.Generator | None:
        if self.is_greedy:
            return None
        generator = torch.Generator()
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


def bad_words_ids(words: Sequence[str], tokenizer) -> tuple[tuple[int, ...], ...]:
    """Each bad word as the token ids it encodes to without special tokens (TensorRT-LLM's preprocessing),
    for SamplingParams.bad_words_ids; a word that encodes to nothing is dropped."""
    if not words:
        return ()
    if tokenizer is None:
        raise DFlashError("bad_words need the target's tokenizer, which this target does not have")
    encoded = (tuple(int(t) for t in tokenizer.encode(word, add_special_tokens=False)) for word in words)
    return tuple(ids for ids in encoded if ids)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target distribution [..., V] after temperature, top-k, then top-p (the usual order)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Token choice per row of logits [N, V] -> [N]: argmax when greedy, else a sample."""
    if params.is_greedy:
        return native.argmax(logits)
    probs = probabilities(logits, params)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


# Position-keyed sampling: the uniform number that draws output token n of a request is a fixed function of
# (seed, n). A sampled request then emits the same tokens whatever it is batched with and whatever block size
# each step verifies: a verify step draws every block position from the target's distribution with the
# position's own uniform, and a position whose draw was discarded (after a rejected draft) is drawn again
# later with the same uniform, which nothing committed depended on, so every emitted token is still a
# target sample given the emitted prefix.
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def keyed_uniforms(seed: int, first_index: int, count: int) -> list[float]:
    """Uniforms in [0, 1) for output indices first_index .. first_index + count - 1 of the stream `seed`."""
    base = _splitmix64(seed & _MASK64)
    return [(_splitmix64(base ^ ((first_index + i) & _MASK64)) >> 11) / float(1 << 53) for i in range(count)]


def new_seed() -> int:
    """A fresh random seed for a sampled request that did not give one."""
    import secrets

    return secrets.randbits(63)


def choose_keyed(logits: torch.Tensor, params: SamplingParams, seed: int, first_index: int) -> torch.Tensor:
    """Token choice per row of logits [N, V] -> [N]; row i is output index first_index + i.

    Greedy: argmax. Sampled: the inverse CDF of the filtered distribution at that index's keyed uniform.
    """
    if params.is_greedy:
        return native.argmax(logits)
    probs = probabilities(logits, params)
    cdf = torch.cumsum(probs, dim=-1)
    uniforms = torch.tensor(keyed_uniforms(seed, first_index, logits.shape[0]), dtype=cdf.dtype, device=cdf.device)
    points = (uniforms * cdf[:, -1]).unsqueeze(-1)
    # right=True skips zero-probability tokens (flat steps of the CDF).
    return torch.searchsorted(cdf, points, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
