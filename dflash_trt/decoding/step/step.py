"""The DFlash decoding step: draft a block, verify it, accept drafts, commit.

Several requests run as one batch (batch.py): each keeps its own positions and its own rows of the target's KV
cache (model/kv_cache.py, left-aligned, masked per row), so each row computes what it would alone. One step is
small pieces, each its own function: `draft_block` (the drafter proposes S - 1 tokens after each row's last
committed token), `verify_block` (one target forward over the verification method's layout of the block; the
method decides what is accepted, step/verify), `commit_block` (keep the accepted drafts plus the target's bonus
token in the cache and in the requests); finished rows then leave the batch (the scheduler). Block size 1 (or no
drafter) is plain autoregressive decoding: the speedup baseline.

The scheduler (decoding/scheduler) calls `decode_step` once per iteration; decoding/api.py runs fixed batches
through the scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dflash_trt.decoding.model.protocols import Drafter, Proposal, Target
from dflash_trt.decoding.step import acceptance
from dflash_trt.decoding.step.batch import RunningBatch
from dflash_trt.decoding.step.results import StepOutput
from dflash_trt.decoding.step.verify import Accepted, ChainVerify, VerifyInput, VerifyMethod
from dflash_trt.errors import DFlashError

CHAIN = ChainVerify()

@dataclass
class Verified:
    """What one verify forward decided (the method's Accepted), with the layout and the block's features."""

    verify: VerifyInput
    accepted: Accepted
    features: torch.Tensor | None  # [B, N, K*D] target features of the new slots


@dataclass
class StepReport:
    outputs: list[StepOutput]
    block_size: int
    accepted: list[int]  # accepted drafts per row (0 .. block_size - 1), for the block-size policy


def decode_step(target: Target, drafter, batch: RunningBatch, block_size: int, layer_ids,
                method: VerifyMethod = CHAIN) -> StepReport:
    """One decoding step of the whole batch with `block_size` (1: plain decoding, no draft).

    Each row's block shrinks to the tokens it still may emit (acceptance.block_lengths), as in the
    reference loop; slots past a row's length are padding that the drafter hides and acceptance ignores.
    """
    remaining = torch.tensor([r.remaining for r in batch.requests], device=batch.last_token.device)
    block_lens = acceptance.block_lengths(remaining, block_size)
    width = int(block_lens.max())
    drafted = drafter is not None and width > 1
    proposal = None
    if drafted:
        block, proposal = draft_block(target, drafter, batch, width, block_lens, method.draft_top_k)
    else:  # plain: the step's features wait for the drafter (batch.PendingFeatures; the scheduler bounds them)
        block = batch.last_token[:, None].clone()
    now = time.perf_counter()
    for request in batch.requests:  # decode-phase timing starts after the first draft call, as in the paper
        request.decode_start = request.decode_start or now
    verified = verify_block(target, batch, block, block_lens, proposal, layer_ids, method)
    outputs = commit_block(target, batch, block, verified, drafted)
    return StepReport(outputs, width, verified.accepted.num_accepted.tolist())


@torch.inference_mode()
def draft_block(target: Target, drafter, batch: RunningBatch, block_size: int,
                block_lens: torch.Tensor | None = None, top_k: int = 0) -> tuple[torch.Tensor, Proposal]:
    """Block [B, S] = [last committed token, S - 1 drafts] (slot k predicts position next_pos + k), and the
    drafter's proposal (drafts, and for a drafter that samples them its candidates and q; with top_k > 0 each
    slot's top-K candidates, for a tree)."""
    block = torch.full((len(batch), block_size), drafter.config.mask_token_id, dtype=torch.long,
                       device=batch.last_token.device)
    block[:, 0] = batch.last_token
    if block_lens is None:
        block_lens = torch.full((len(batch),), block_size, dtype=torch.long, device=block.device)
    sampling = [(r.params.temperature, r.generator) for r in batch.requests]
    batch.trim_draft_cache()
    features, ctx_lens = batch.take_pending_features()
    proposal = acceptance.propose(drafter, target, block, features, ctx_lens, batch.draft_cache, block_lens, sampling,
                                  top_k)
    block[:, 1:] = proposal.drafts
    if not torch.equal(batch.draft_cache.lens, batch.next_pos):
        raise RuntimeError("draft cache out of step with the committed context")  # internal invariant
    return block, proposal


@torch.inference_mode()
def absorb_context(target: Target, drafter, batch: RunningBatch) -> None:
    """Let the drafter take in the pending context rows (a draft call whose drafts, if any, are not used: the anchor
    alone where the drafter allows it, protocols.Drafter.absorb_block)."""
    draft_block(target, drafter, batch, getattr(drafter, "absorb_block", 2))


@torch.inference_mode()
def verify_block(target: Target, batch: RunningBatch, block: torch.Tensor, block_lens: torch.Tensor,
                 proposal: Proposal | None, layer_ids, method: VerifyMethod = CHAIN) -> Verified:
    """One target forward over the method's layout of the block; the method decides what is accepted.

    The new slots are written at each row's own length; the cache masks them as the layout says (a chain:
    causal). Requests with logits processors (min_tokens, bad words, penalties) have their logits processed by
    the method, each slot with the prefix it is verified for (logits_processors.py).
    """
    verify = method.layout(batch, block, block_lens, proposal)
    num_new = verify.tokens.shape[1]
    if verify.block_mask is None:  # a chain: causal, slot == position (the cache's fast path)
        masks = batch.cache.prepare(num_new)
    else:
        masks = batch.cache.prepare(num_new, verify.positions, verify.block_mask)
    out = target.forward(verify.tokens, verify.positions, masks, batch.cache, layer_ids)
    return Verified(verify, method.accept(out.logits, verify, proposal, batch), out.features)


@torch.inference_mode()
def commit_block(target: Target, batch: RunningBatch, block: torch.Tensor, verified: Verified,
                 drafted: bool) -> list[StepOutput]:
    """Keep the accepted drafts + bonus token of every row in the cache and in its request."""
    accepted, num_accepted = verified.accepted, verified.accepted.num_accepted
    # Each row keeps its last committed token and its accepted drafts (moved into place when they are not a
    # prefix of the slots); the rest of its slots become stale, masked, and overwritten by the next step.
    batch.cache.keep(num_accepted + 1, accepted.keep)
    if verified.features is not None:
        num_kept = int(num_accepted.max()) + 1
        features = verified.features if accepted.keep is None else torch.gather(
            verified.features, 1, accepted.keep[:, :, None].expand(-1, -1, verified.features.shape[2]))
        kept_counts = (num_accepted + 1).tolist()
        batch.append_features(features[:, :num_kept], kept_counts)
        for row, (request, kept) in enumerate(zip(batch.requests, kept_counts)):
            if request.history_features is not None:
                request.history_features.append(features[row, :kept])
    batch.trim()

    num_drafts = (verified.verify.lengths - 1).tolist() if drafted else [0] * len(batch.requests)
    outputs = []
    accepted_list, bonus = num_accepted.tolist(), accepted.bonus.tolist()
    batch.last_token = accepted.bonus.clone()  # the token after the accepted drafts
    for row, request in enumerate(batch.requests):
        a = accepted_list[row]
        committed = request.commit(accepted.drafts[row] + [bonus[row]])
        # As the reference records it: the tokens this step produced, after max_new_tokens and stops.
        request.result.acceptance_lengths.append(len(committed))
        request.result.draft_lengths.append(num_drafts[row])
        outputs.append(request.step_output(committed, len(committed), num_drafts[row], min(a, len(committed))))
    return outputs


def resolve_block_size(drafter: Drafter | None, block_size: int | None) -> int:
    if block_size is None:
        block_size = drafter.config.block_size if drafter is not None else 1
    if block_size < 1:
        raise DFlashError(f"block_size must be >= 1, got {block_size}")
    if block_size > 1 and drafter is None:
        raise DFlashError(f"block_size {block_size} needs a drafter")
    return block_size
