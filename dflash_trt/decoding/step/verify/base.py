"""The verification seam's types: the verify forward's input, the decision, and the method protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from dflash_trt.decoding.model.protocols import Proposal


@dataclass
class VerifyInput:
    """The verify forward of a batch: N new slots per row, slot 0 the last committed token.

    tokens, positions [B, N]; lengths [B]: real slots per row (the rest is padding acceptance ignores);
    block_mask [B, N, N] (bool): new slot i attends to new slot j; None means causal (j <= i).
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    block_mask: torch.Tensor | None = None


@dataclass
class Accepted:
    """What a verify decided per row: num_accepted [B] drafts accepted, bonus [B] the target's token after them,
    drafts: the accepted draft tokens of each row (in order), keep [B, K]: the new slots whose KV and features
    stay (slot 0 first, then the accepted path; each row's first num_accepted + 1 entries count), or None when
    they are the first num_accepted + 1 slots (a chain)."""

    num_accepted: torch.Tensor
    bonus: torch.Tensor
    drafts: list[list[int]]
    keep: torch.Tensor | None = None


class VerifyMethod(Protocol):
    """A verification method (module docstring)."""

    name: str
    draft_top_k: int  # candidates per slot the drafter must propose (0: drafts only)

    def verify_slots(self, block_size: int) -> int:
        """New KV slots a row may write in one verify forward of a step of `block_size` (for reservations)."""

    def check(self, target, drafter) -> None:
        """Raise a one-line DFlashError when `target` or `drafter` cannot run this method."""

    def layout(self, batch, block: torch.Tensor, block_lens: torch.Tensor, proposal: Proposal | None
               ) -> VerifyInput:
        """The verify input of `batch` for block [B, S] (anchor + drafts) with block_lens [B] real slots."""

    def accept(self, logits: torch.Tensor, verify: VerifyInput, proposal: Proposal | None, batch) -> Accepted:
        """The decision from the target's logits [B, N, V] over `verify` (requests' logits processors applied
        here, each slot with its own prefix)."""
