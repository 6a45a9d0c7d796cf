"""The chain: DFlash's own verification. The block is one causal sequence (anchor, drafts 1..S-1) at consecutive
positions; drafts are accepted while they equal the target's own choice at the slot before them.

The target's choice is its greedy token, or for a sampled request a keyed sample of its processed distribution
(sampling.choose_keyed: slot j draws output index len(tokens so far) + j of the request's stream, so the batch and
the block size never change what a request emits). Drafts drawn from a q (the DFlash2 selector at T > 0) go
through rejection sampling against it instead (acceptance.accept_row). Either way every committed token is a sample
of the target given its prefix: lossless. The accepted slots are a prefix of the block, so the cache keeps a prefix.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.model.protocols import Proposal
from dflash_trt.decoding.step import acceptance, logits_processors
from dflash_trt.decoding.step.sampling import choose_keyed
from dflash_trt.decoding.step.verify.base import Accepted, VerifyInput


class ChainVerify:
    """Verification of a chain of drafts (module docstring); implements VerifyMethod."""

    name = "chain"
    draft_top_k = 0

    def verify_slots(self, block_size: int) -> int:
        return block_size

    def check(self, target, drafter) -> None:
        """Every target and drafter runs a chain."""

    def layout(self, batch, block: torch.Tensor, block_lens: torch.Tensor, proposal: Proposal | None
               ) -> VerifyInput:
        steps = torch.arange(block.shape[1], device=block.device)
        return VerifyInput(block, batch.next_pos[:, None] + steps[None, :], block_lens)

    def accept(self, logits: torch.Tensor, verify: VerifyInput, proposal: Proposal | None, batch) -> Accepted:
        block, block_lens, requests = verify.tokens, verify.lengths, batch.requests
        if any(request.params.has_logits_processors for request in requests):
            # Slot j is processed with the committed tokens + drafts 1..j: the prefix it is verified for.
            logits = logits_processors.process_requests(logits, block, requests)
        if all(request.params.is_greedy for request in requests):
            choices = torch.argmax(logits, dim=-1)
        else:  # slot j of row b draws output index len(tokens so far) + j of that request's stream
            choices = torch.stack([choose_keyed(logits[row], request.params, request.seed,
                                                len(request.result.token_ids))
                                   for row, request in enumerate(requests)])
        accepted = torch.minimum(acceptance.acceptance_lengths(block, choices), block_lens - 1)
        bonus = choices.gather(1, accepted[:, None]).squeeze(1)
        if proposal is not None and proposal.q is not None:
            for row, request in enumerate(requests):
                if not request.params.is_greedy:
                    a, token = acceptance.accept_row(logits[row], block[row], int(block_lens[row]), proposal, row,
                                                     request.params, request.generator)
                    accepted[row], bonus[row] = a, token
        rows = block.tolist()
        drafts = [rows[row][1:a + 1] for row, a in enumerate(accepted.tolist())]
        return Accepted(accepted, bonus, drafts)
