"""Sampling parameters and how the target's verify logits become token choices.

Verification draws every block position from the target's own (temperature, top-k, top-p adjusted)
distribution; a draft token is accepted only on exact match. With a one-hot (argmax) draft this is exact
speculative sampling, so every emitted token is a target sample given the emitted prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. temperature 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1.0 = no nucleus filter
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.max_new_tokens <= 0:
            raise DFlashError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise DFlashError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise DFlashError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise DFlashError(f"top_p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self) -> torch.Generator | None:
        if self.is_greedy:
            return None
        generator = torch.Generator()
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


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
        return torch.argmax(logits, dim=-1)
    probs = probabilities(logits, params)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
