"""A drafter that knows the target's greedy continuation, to drive the loop through long acceptances.

Random drafters are almost never accepted; this one proposes the reference tokens and corrupts a
deterministic pseudo-random subset, so acceptance lengths vary from step to step and across the batch.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.model.drafters import DFlashDrafter, DraftCache, Proposal


class _TrackedCache(DraftCache):
    """Remembers which original sequence each batch row holds, through batch compaction."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sequence_ids = list(range(self.lens.shape[0]))

    def select(self, indices):
        super().select(indices)
        self.sequence_ids = [self.sequence_ids[int(i)] for i in indices]


class OracleDrafter(DFlashDrafter):
    def __init__(self, config, references: list[list[int]], corrupt_every: int = 6):
        super().__init__(config)
        self.references = references  # prompt + reference continuation, per sequence
        self.corrupt_every = corrupt_every
        self.hash_keys = list(range(len(references)))  # per sequence; fixes which drafts get corrupted

    def new_cache(self, batch_size, capacity):
        return _TrackedCache(self.config, batch_size, capacity, torch.float32)

    def propose(self, target, block, features, ctx_lens, cache, **kwargs):
        super().propose(target, block, features, ctx_lens, cache, **kwargs)  # keeps the cache bookkeeping real
        drafts = torch.zeros(block.shape[0], block.shape[1] - 1, dtype=torch.long)
        for row, seq in enumerate(cache.sequence_ids):
            start = int(cache.lens[row])
            reference = self.references[seq]
            for k in range(1, block.shape[1]):
                position = start + k
                token = reference[position] if position < len(reference) else 0
                if _hash(position, self.hash_keys[seq]) % self.corrupt_every == 0:
                    token = (token + 1) % self.config.vocab_size
                drafts[row, k - 1] = token
        return Proposal(drafts)


def _hash(position: int, seq: int) -> int:
    # Knuth's multiplicative hash: deterministic, but runs of uncorrupted tokens vary in length.
    return ((position * 2654435761 + seq * 40503) & 0xFFFFFFFF) >> 16


class SelfDrafter(DFlashDrafter):
    """Proposes the target's own greedy continuation of each row's committed history.

    The history is rebuilt from what the loop shows a drafter: the block's first token (the last committed
    one), the new start position, and the proposals of the previous step (accepted = start jump - 1).
    `greedy_next(tokens) -> token` gives the target's argmax after a token sequence.
    """

    def __init__(self, config, prompts: list[list[int]], greedy_next):
        super().__init__(config)
        self.histories = [list(p) for p in prompts]
        self.greedy_next = greedy_next
        self.previous: dict[int, tuple[int, list[int]]] = {}

    def new_cache(self, batch_size, capacity):
        return _TrackedCache(self.config, batch_size, capacity, torch.float32)

    def propose(self, target, block, features, ctx_lens, cache, **kwargs):
        super().propose(target, block, features, ctx_lens, cache, **kwargs)
        drafts = torch.zeros(block.shape[0], block.shape[1] - 1, dtype=torch.long)
        for row, seq in enumerate(cache.sequence_ids):
            start, history = int(cache.lens[row]), self.histories[seq]
            if seq in self.previous:
                old_start, old_drafts = self.previous[seq]
                history.extend(old_drafts[: start - old_start - 1])
            history.append(int(block[row, 0]))
            assert len(history) == start + 1, "history reconstruction out of step"
            proposal = list(history)
            for k in range(block.shape[1] - 1):
                proposal.append(self.greedy_next(proposal))
            drafts[row] = torch.tensor(proposal[len(history):])
            self.previous[seq] = (start, drafts[row].tolist())
        return Proposal(drafts)
