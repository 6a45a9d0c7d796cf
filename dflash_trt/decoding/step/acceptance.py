"""From a drafted block to committed tokens: the tail block's size, the drafter call, and acceptance.

Greedy and one-hot drafts: accept the leading drafts equal to the target's own choice (argmax, or a
sample of its filtered distribution), then commit the target's token after them. Drafts drawn from a
distribution q (the DFlash2 selector at T > 0): standard speculative sampling, accept d_j iff
u * q_j(d_j) < pi_{j-1}(d_j), and on a rejection draw the bonus from max(pi - q, 0) renormalised. Both are
lossless: every committed token is a sample of the target given the committed prefix.

The last block of a generation shrinks to the tokens that remain, as in the reference loop, so drafts,
tokens and acceptance lengths equal the reference's to the end. In a batch each row has its own block
length; slots past it are padding the drafter hides and acceptance ignores.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.model.protocols import Drafter, Proposal
from dflash_trt.decoding.step.sampling import SamplingParams, choose, probabilities


def acceptance_lengths(block: torch.Tensor, choices: torch.Tensor) -> torch.Tensor:
    """Accepted drafts per sequence: leading j in 1..S-1 with block[:, j] == choices[:, j-1].

    block [B,S] = [anchor, drafts...]; choices [B,S]: the target's token for the position after each slot.
    """
    matches = (block[:, 1:] == choices[:, :-1]).long()
    return matches.cumprod(dim=1).sum(dim=1)


def block_lengths(remaining: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slots of each row's next block: min(block_size, tokens still to generate + 1).

    The +1 is the anchor slot: a block of L slots can commit at most L tokens, and the loop never
    drafts past the last token it may emit.
    """
    return (remaining + 1).clamp(max=block_size)


def propose(drafter: Drafter, target, block, features, ctx_lens, cache, block_lens: torch.Tensor,
            sampling, top_k: int = 0) -> Proposal:
    """Call drafter.propose, passing block_lens only for a ragged batch, sampling only to drafters
    that draw their drafts, and top_k only when a tree asks for candidates."""
    ragged = bool((block_lens < block.shape[1]).any())
    extra = {"top_k": top_k} if top_k > 0 else {}
    return drafter.propose(target, block, features, ctx_lens, cache, block_lens=block_lens if ragged else None,
                           sampling=sampling if drafter.samples_drafts else None, **extra)


def accept_row(logits: torch.Tensor, block: torch.Tensor, length: int, proposal: Proposal, row: int,
               params: SamplingParams, generator: torch.Generator | None) -> tuple[int, int]:
    """(accepted drafts a, the token after them) for one row.

    logits [S,V]: the target's verify logits of the row; block [S]: anchor + drafts; only the first
    `length` slots are real.
    """
    logits, block = logits[:length], block[:length]
    if params.is_greedy or proposal.q is None:
        choices = choose(logits, params, generator)
        a = int(acceptance_lengths(block[None], choices[None])[0])
        return a, int(choices[a])
    return _rejection_sample(probabilities(logits, params), block[1:], proposal.candidates[row, :length - 1],
                             proposal.q[row, :length - 1], generator)


def _rejection_sample(target_probs: torch.Tensor, drafts: torch.Tensor, candidates: torch.Tensor,
                      q: torch.Tensor, generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling of drafts [n] drawn from q [n,K] over candidates [n,K]; target_probs [n+1,V]."""
    n = drafts.shape[0]
    p = target_probs[torch.arange(n), drafts]
    q_of_draft = (q * (candidates == drafts[:, None])).sum(-1)
    u = torch.rand(n, generator=generator)
    a = int((u * q_of_draft < p).long().cumprod(0).sum())
    if a == n:
        return a, _draw(target_probs[n], generator)
    residual = target_probs[a].clone()
    residual.scatter_add_(0, candidates[a], -q[a])
    residual.clamp_(min=0)
    total = residual.sum()
    return a, _draw(residual / total if total > 0 else target_probs[a], generator)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator)[0])
