"""The DFlash decoding step: draft a block, verify it, accept a prefix, commit.

Several requests run as one batch (batch.py): each keeps its own positions and its own rows of the
target's KV cache (kv_cache.py, left-aligned, masked per row), so each row computes what it would alone. One step is four
small pieces, each its own function: `draft_block` (the drafter proposes S - 1 tokens after each row's
last committed token), `verify_block` (one target forward over the block; the target's own choice at
every position), `commit_block` (keep the accepted prefix plus the target's bonus token in the cache
and in the requests), and the scheduler's leave step (finished rows leave the batch). Block size 1 (or
no drafter) is plain autoregressive decoding: the speedup baseline.

The scheduler (decoding/scheduler) calls `decode_step` once per iteration; decoding/api.py runs fixed batches
through the scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dflash_trt.decoding.step import acceptance, logits_processors
from dflash_trt.decoding.step.acceptance import acceptance_lengths  # noqa: F401  (part of this module's API)
from dflash_trt.decoding.step.batch import RunningBatch
from dflash_trt.decoding.model.drafters import DFlashDrafter
from dflash_trt.errors import DFlashError
from dflash_trt.decoding.step.results import StepOutput
from dflash_trt.decoding.step.sampling import choose_keyed
from dflash_trt.decoding.model.target import TargetModel

# Plain steps (block size 1) still record the target's features for the drafter; once this many context
# rows are pending, the drafter takes them in (one draft call) so they never pile up.
FEATURE_BACKLOG = 32


@dataclass
class Verified:
    """What one verify forward decided: the target's choices and the accepted drafts per row."""

    choices: torch.Tensor  # [B, S]
    accepted: torch.Tensor  # [B]
    bonus: torch.Tensor  # [B] the token committed after the accepted drafts
    block_lens: torch.Tensor  # [B] real slots of each row's block
    features: torch.Tensor | None  # [B, S, K*D] target features of the block positions


@dataclass
class StepReport:
    outputs: list[StepOutput]
    block_size: int
    accepted: list[int]  # accepted drafts per row (0 .. block_size - 1), for the block-size policy


def decode_step(target: TargetModel, drafter, batch: RunningBatch, block_size: int, layer_ids) -> StepReport:
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
        block, proposal = draft_block(target, drafter, batch, width, block_lens)
    else:
        block = batch.last_token[:, None].clone()
        if drafter is not None and batch.features is not None and batch.features.shape[1] >= FEATURE_BACKLOG:
            absorb_context(target, drafter, batch)
    now = time.perf_counter()
    for request in batch.requests:  # decode-phase timing starts after the first draft call, as in the paper
        request.decode_start = request.decode_start or now
    verified = verify_block(target, batch, block, block_lens, proposal, layer_ids)
    outputs = commit_block(target, batch, block, verified, drafted)
    return StepReport(outputs, width, verified.accepted.tolist())


@torch.inference_mode()
def draft_block(target: TargetModel, drafter, batch: RunningBatch, block_size: int,
                block_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, acceptance.Proposal]:
    """Block [B, S] = [last committed token, S - 1 drafts] (slot k predicts position next_pos + k), and the
    drafter's proposal (drafts, and for a drafter that samples them its candidates and q)."""
    block = torch.full((len(batch), block_size), drafter.config.mask_token_id, dtype=torch.long,
                       device=batch.last_token.device)
    block[:, 0] = batch.last_token
    if block_lens is None:
        block_lens = torch.full((len(batch),), block_size, dtype=torch.long, device=block.device)
    sampling = [(r.params.temperature, r.generator) for r in batch.requests]
    proposal = acceptance.propose(drafter, target, block, batch.features, batch.ctx_lens, batch.draft_cache,
                                  block_lens, sampling)
    block[:, 1:] = proposal.drafts
    if not torch.equal(batch.draft_cache.lens, batch.next_pos):
        raise RuntimeError("draft cache out of step with the committed context")  # internal invariant
    batch.features, batch.ctx_lens = batch.features[:, :0], torch.zeros_like(batch.ctx_lens)
    return block, proposal


@torch.inference_mode()
def absorb_context(target: TargetModel, drafter, batch: RunningBatch) -> None:
    """Let the drafter take in the pending context rows (a draft call whose drafts are not used)."""
    draft_block(target, drafter, batch, 2)


@torch.inference_mode()
def verify_block(target: TargetModel, batch: RunningBatch, block: torch.Tensor, block_lens: torch.Tensor,
                 proposal: acceptance.Proposal | None, layer_ids) -> Verified:
    """One target forward over the block; choices[b, j] is the target's token after block slot j.

    Drafts are accepted while they equal the target's own choice (greedy or a keyed sample), within the
    row's block length; drafts sampled from a q (the DFlash2 selector at T > 0) go through rejection
    sampling against it instead (acceptance.accept_row). Requests with logits processors (min_tokens, bad
    words, penalties) have their logits processed first (logits_processors.py).
    """
    block_size = block.shape[1]
    device = block.device
    positions = batch.next_pos[:, None] + torch.arange(block_size, device=device)[None, :]
    masks = batch.cache.prepare(block_size)  # the block is written at each row's own length
    out = target.forward(block, positions, masks, batch.cache, layer_ids)
    logits = out.logits
    if any(request.params.has_logits_processors for request in batch.requests):
        # Slot j is processed with the committed tokens + drafts 1..j: the prefix it is verified for.
        logits = logits_processors.process_requests(logits, block, batch.requests)
    if all(request.params.is_greedy for request in batch.requests):
        choices = torch.argmax(logits, dim=-1)
    else:  # slot j of row b draws output index len(tokens so far) + j of that request's stream
        choices = torch.stack([choose_keyed(logits[row], request.params, request.seed,
                                            len(request.result.token_ids))
                               for row, request in enumerate(batch.requests)])
    accepted = torch.minimum(acceptance_lengths(block, choices), block_lens - 1)
    bonus = choices.gather(1, accepted[:, None]).squeeze(1)
    if proposal is not None and proposal.q is not None:
        for row, request in enumerate(batch.requests):
            if not request.params.is_greedy:
                a, token = acceptance.accept_row(logits[row], block[row], int(block_lens[row]), proposal, row,
                                                 request.params, request.generator)
                accepted[row], bonus[row] = a, token
    return Verified(choices, accepted, bonus, block_lens, out.features)


@torch.inference_mode()
def commit_block(target: TargetModel, batch: RunningBatch, block: torch.Tensor, verified: Verified,
                 drafted: bool) -> list[StepOutput]:
    """Keep the accepted prefix + bonus token of every row in the cache and in its request."""
    accepted = verified.accepted
    # Each row keeps its accepted slots in place (the last committed token and the accepted drafts); the
    # rest of its block becomes stale, masked, and overwritten by the next step.
    batch.cache.set_lengths(batch.next_pos + accepted + 1)
    num_kept = int(accepted.max()) + 1
    if verified.features is not None:
        batch.append_features(verified.features[:, :num_kept], accepted + 1)
    batch.trim()

    num_drafts = (verified.block_lens - 1).tolist() if drafted else [0] * len(batch.requests)
    outputs = []
    accepted_list, bonus = accepted.tolist(), verified.bonus.tolist()
    block_rows = block.tolist()
    batch.last_token = verified.bonus.clone()  # the token after the accepted drafts
    for row, request in enumerate(batch.requests):
        a = accepted_list[row]
        committed = request.commit(block_rows[row][1:a + 1] + [bonus[row]])
        # As the reference records it: the tokens this step produced, after max_new_tokens and stops.
        request.result.acceptance_lengths.append(len(committed))
        request.result.draft_lengths.append(num_drafts[row])
        outputs.append(request.step_output(committed, len(committed), num_drafts[row], min(a, len(committed))))
    return outputs


def resolve_block_size(drafter: DFlashDrafter | None, block_size: int | None) -> int:
    if block_size is None:
        block_size = drafter.config.block_size if drafter is not None else 1
    if block_size < 1:
        raise DFlashError(f"block_size must be >= 1, got {block_size}")
    if block_size > 1 and drafter is None:
        raise DFlashError(f"block_size {block_size} needs a drafter")
    return block_size
