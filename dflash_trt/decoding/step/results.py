"""What one generation produced, and the per-step events of a streaming generation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationResult:
    """New tokens of one sequence plus its speculative-decoding statistics.

    acceptance_lengths holds the tokens each verify step produced: a + 1 (accepted drafts plus the target's
    bonus token), cut at max_new_tokens and after a stop token, as the reference records it.
    Timing is decode-phase only in decode_s: it excludes the prefill and the first draft call.
    """

    token_ids: list[int]
    finish_reason: str  # "stop" (a stop token, included) or "length" (max_new_tokens reached)
    block_size: int
    acceptance_lengths: list[int] = field(default_factory=list)
    # Drafts verified at each step when the block size varies from step to step (the scheduler's policy);
    # empty: every step verified block_size - 1 drafts.
    draft_lengths: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    num_cached_tokens: int = 0  # prompt tokens served from the scheduler's prefix cache (not computed)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_verify_steps(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def num_draft_tokens(self) -> int:
        if self.draft_lengths:
            return sum(self.draft_lengths)
        return self.num_verify_steps * (self.block_size - 1)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(length - 1 for length in self.acceptance_lengths)

    @property
    def tau(self) -> float:
        """Mean acceptance length per verify step (1 .. block_size); 0 when no step ran."""
        steps = self.acceptance_lengths
        return sum(steps) / len(steps) if steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def time_per_output_token(self) -> float:
        return self.decode_s / self.num_output_tokens if self.num_output_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "block_size": self.block_size,
            "num_output_tokens": self.num_output_tokens,
            "tau": self.tau,
            "acceptance_lengths": self.acceptance_lengths,
            "draft_lengths": self.draft_lengths,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "num_cached_tokens": self.num_cached_tokens,
        }


@dataclass
class StepOutput:
    """Tokens one sequence committed in one step (the first token comes from the prefill)."""

    index: object  # the request id (generate/decode: the prompt's position in the batch given)
    new_token_ids: list[int]
    acceptance_length: int | None  # None for the first token, which is not drafted
    is_final: bool
    result: GenerationResult | None = None  # set on the final step
    num_draft_tokens: int | None = None  # drafts verified in this step (None: no verify step)
    # Drafts this step accepted and committed: acceptance_length - 1, except for a step cut by max_new_tokens
    # or a stop token, where every committed token may be an accepted draft (None: acceptance_length - 1).
    num_accepted_drafts: int | None = None
    num_cached_tokens: int = 0  # prompt tokens of this request served from the prefix cache
