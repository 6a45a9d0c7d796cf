"""The DFlash decoding loop: prefill, then draft a block, verify it, accept a prefix, repeat.

Several sequences run as one batch. Each keeps its own positions; the target's KV cache is shared
in length and right-aligned: every row's valid slots are contiguous at the end, with left padding masked
out, so each sequence computes what it would alone. A sequence leaves the batch when it finishes. block_size 1 (or no drafter) is plain autoregressive decoding: the speedup baseline.
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import torch

from . import acceptance
from .acceptance import acceptance_lengths  # noqa: F401  (part of this module's API)
from .drafter import DFlashDrafter
from .errors import DFlashError
from .results import GenerationResult, StepOutput
from .sampling import SamplingParams, choose
from .target import TargetModel


class _Sequence:
    """Bookkeeping of one sequence: committed tokens, stop rules, statistics."""

    def __init__(self, index: int, prompt: Sequence[int], params: SamplingParams, block_size: int):
        if not prompt:
            raise DFlashError(f"prompt {index} is empty")
        self.index, self.prompt, self.params = index, list(prompt), params
        self.generator = params.make_generator()
        self.result = GenerationResult(token_ids=[], finish_reason="", block_size=block_size)
        self.decode_start = 0.0

    @property
    def is_finished(self) -> bool:
        return bool(self.result.finish_reason)

    def commit(self, tokens: list[int]) -> list[int]:
        """Append tokens up to a stop token (included) or max_new_tokens; returns those appended."""
        committed = []
        for token in tokens:
            committed.append(token)
            self.result.token_ids.append(token)
            if token in self.params.stop_token_ids:
                self.result.finish_reason = "stop"
            elif len(self.result.token_ids) >= self.params.max_new_tokens:
                self.result.finish_reason = "length"
            if self.is_finished:
                self.result.decode_s = max(time.perf_counter() - self.decode_start, 0.0)
                break
        return committed

    def step_output(self, tokens: list[int], acceptance_length: int | None) -> StepOutput:
        done = self.is_finished
        return StepOutput(self.index, tokens, acceptance_length, done, self.result if done else None)


class _Batch:
    """Tensors shared by the active sequences; row b belongs to seqs[b]."""

    def __init__(self, seqs: list[_Sequence], target: TargetModel):
        self.seqs = seqs
        self.cache = target.new_cache()
        device = target.device
        lengths = torch.tensor([len(s.prompt) for s in seqs], device=device)
        width = int(lengths.max())
        self.pad = width - lengths  # prompts are left-padded to a common width
        self.tokens = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
        for row, seq in enumerate(seqs):
            self.tokens[row, int(self.pad[row]):] = torch.tensor(seq.prompt, device=device)
        self.mask = torch.arange(width, device=device)[None, :] >= self.pad[:, None]  # [B, cache length]
        self.next_pos = lengths.clone()  # position of the next uncommitted token, per sequence
        self.last_token = torch.zeros(len(seqs), dtype=torch.long, device=device)
        self.features: torch.Tensor | None = None  # new context rows for the drafter, left-aligned
        self.ctx_lens = lengths.clone()
        self.draft_cache = None

    def select(self, rows: list[int]) -> None:
        index = torch.tensor(rows, device=self.mask.device)
        self.seqs = [self.seqs[r] for r in rows]
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.last_token = self.mask[index], self.next_pos[index], self.last_token[index]
        self.ctx_lens = self.ctx_lens[index]
        if self.features is not None:
            self.features = self.features[index]
        if self.draft_cache is not None:
            self.draft_cache.select(index)


def stream_generate(target: TargetModel, drafter: DFlashDrafter | None, prompt: Sequence[int],
                    params: SamplingParams, block_size: int | None = None) -> Iterator[StepOutput]:
    """Generate for one prompt, yielding the tokens committed at every step as soon as they exist."""
    yield from decode(target, drafter, [prompt], [params], block_size)


def generate(target: TargetModel, drafter: DFlashDrafter | None, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams], block_size: int | None = None
             ) -> list[GenerationResult]:
    """Generate for a batch of prompts; returns one GenerationResult per prompt, in order."""
    params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    results: list[GenerationResult | None] = [None] * len(prompts)
    for step in decode(target, drafter, prompts, params_list, block_size):
        if step.is_final:
            results[step.index] = step.result
    return results  # type: ignore[return-value]


def decode(target: TargetModel, drafter: DFlashDrafter | None, prompts: Sequence[Sequence[int]],
           params_list: Sequence[SamplingParams], block_size: int | None = None) -> Iterator[StepOutput]:
    """The speculative loop of dflash.md over a batch; yields a StepOutput per sequence and step."""
    if len(params_list) != len(prompts):
        raise DFlashError("one SamplingParams per prompt is required")
    block_size = _resolve_block_size(drafter, block_size)
    use_drafter = block_size > 1
    if use_drafter:
        target.check_drafter(drafter.config)
    layer_ids = drafter.config.target_layer_ids if use_drafter else ()
    seqs = [_Sequence(i, p, params, block_size) for i, (p, params) in enumerate(zip(prompts, params_list))]
    _check_context(target, seqs, block_size)

    batch = _Batch(seqs, target)
    if use_drafter:
        capacity = max(len(s.prompt) + s.params.max_new_tokens for s in seqs) + block_size
        batch.draft_cache = drafter.new_cache(len(seqs), capacity)
    yield from _prefill(target, batch, layer_ids)
    _drop_finished(batch)
    is_first_draft = True
    while batch.seqs:
        remaining = torch.tensor([s.params.max_new_tokens - len(s.result.token_ids) for s in batch.seqs],
                                 device=target.device)
        block_lens = acceptance.block_lengths(remaining, block_size)  # the last block shrinks
        block = torch.full((len(batch.seqs), int(block_lens.max())),
                           drafter.config.mask_token_id if use_drafter else 0, dtype=torch.long, device=target.device)
        block[:, 0] = batch.last_token
        proposal = None
        if use_drafter and block.shape[1] > 1:
            proposal = _draft(target, drafter, batch, block, block_lens)
            block[:, 1:] = proposal.drafts
        if is_first_draft:  # decode-phase timing starts after the first draft call, as in the paper
            is_first_draft = False
            for seq in batch.seqs:
                seq.decode_start = time.perf_counter()
        yield from _verify(target, batch, block, block_lens, proposal, layer_ids)
        _drop_finished(batch)


def _resolve_block_size(drafter: DFlashDrafter | None, block_size: int | None) -> int:
    if block_size is None:
        block_size = drafter.config.block_size if drafter is not None else 1
    if block_size < 1:
        raise DFlashError(f"block_size must be >= 1, got {block_size}")
    if block_size > 1 and drafter is None:
        raise DFlashError(f"block_size {block_size} needs a drafter")
    return block_size


def _check_context(target: TargetModel, seqs: list[_Sequence], block_size: int) -> None:
    limit = target.max_context
    for seq in seqs:
        needed = len(seq.prompt) + seq.params.max_new_tokens + block_size
        if limit and needed > limit:
            raise DFlashError(f"prompt {seq.index}: {len(seq.prompt)} prompt tokens + max_new_tokens "
                              f"{seq.params.max_new_tokens} + block {block_size} exceed the target's context "
                              f"of {limit} tokens")


@torch.inference_mode()
def _prefill(target: TargetModel, batch: _Batch, layer_ids) -> Iterator[StepOutput]:
    start = time.perf_counter()
    positions = (torch.cumsum(batch.mask.long(), dim=1) - 1).clamp(min=0)
    out = target.forward(batch.tokens, positions, batch.mask.long(), batch.cache, layer_ids, last_only=True)
    if out.features is not None:
        # Left padding -> left-aligned context rows (row i of sequence b = prompt position i).
        width = out.features.shape[1]
        index = (torch.arange(width, device=batch.pad.device)[None, :] + batch.pad[:, None]).clamp(max=width - 1)
        batch.features = torch.gather(out.features, 1, index[:, :, None].expand(-1, -1, out.features.shape[2]))
    prefill_s = time.perf_counter() - start
    for row, seq in enumerate(batch.seqs):
        first = int(choose(out.logits[row, -1:], seq.params, seq.generator)[0])
        batch.last_token[row] = first
        seq.result.prefill_s = prefill_s
        seq.decode_start = time.perf_counter()
        yield seq.step_output(seq.commit([first]), None)


@torch.inference_mode()
def _draft(target: TargetModel, drafter: DFlashDrafter, batch: _Batch, block: torch.Tensor,
           block_lens: torch.Tensor) -> acceptance.Proposal:
    """Drafts for block slots 1..S-1 (slot k predicts position start + k)."""
    sampling = [(s.params.temperature, s.generator) for s in batch.seqs]
    proposal = acceptance.propose(drafter, target, block, batch.features, batch.ctx_lens, batch.draft_cache,
                                  block_lens, sampling)
    if not torch.equal(batch.draft_cache.lens, batch.next_pos):
        raise RuntimeError("draft cache out of step with the committed context")  # internal invariant
    return proposal


@torch.inference_mode()
def _verify(target: TargetModel, batch: _Batch, block: torch.Tensor, block_lens: torch.Tensor,
            proposal: acceptance.Proposal | None, layer_ids) -> Iterator[StepOutput]:
    num_seqs, block_size = block.shape
    device = block.device
    positions = batch.next_pos[:, None] + torch.arange(block_size, device=device)[None, :]
    cached = batch.mask.shape[1]
    mask = torch.cat((batch.mask, torch.ones(num_seqs, block_size, dtype=torch.bool, device=device)), dim=1)
    out = target.forward(block, positions, mask.long(), batch.cache, layer_ids)
    proposal = proposal or acceptance.Proposal(block[:, 1:])
    decisions = [acceptance.accept_row(out.logits[row], block[row], int(block_lens[row]), proposal, row,
                                       seq.params, seq.generator) for row, seq in enumerate(batch.seqs)]
    accepted = torch.tensor([a for a, _ in decisions], device=device)  # a per sequence

    # Keep the slots of the longest committed run; rows that committed fewer are shifted right so that
    # their unused slots become left padding.
    num_kept = int(accepted.max()) + 1
    batch.cache.crop(cached + num_kept)
    shifts = num_kept - 1 - accepted
    batch.mask = mask[:, :cached + num_kept]
    if bool(shifts.any()):
        target.shift_right(batch.cache, shifts)
        width = batch.mask.shape[1]
        batch.mask = torch.arange(width, device=device)[None, :] >= (shifts + (~batch.mask).sum(dim=1))[:, None]
    batch.next_pos = batch.next_pos + accepted + 1
    batch.ctx_lens = accepted + 1
    if out.features is not None:
        batch.features = out.features[:, :num_kept]

    for row, (seq, (a, bonus)) in enumerate(zip(batch.seqs, decisions)):
        batch.last_token[row] = bonus
        committed = seq.commit(block[row, 1:a + 1].tolist() + [bonus])
        # As the reference records it: the tokens this step produced, after max_new_tokens and stops.
        seq.result.acceptance_lengths.append(len(committed))
        yield seq.step_output(committed, len(committed))


def _drop_finished(batch: _Batch) -> None:
    active = [row for row, seq in enumerate(batch.seqs) if not seq.is_finished]
    if not active:
        batch.seqs = []
    elif len(active) != len(batch.seqs):
        batch.select(active)
