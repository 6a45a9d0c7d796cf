"""A drafter that knows each request's greedy continuation, and follows rows through joins and leaves.

The scheduler creates one draft cache per prefill group, in arrival order, and concatenates them as groups
join; the cache here numbers its rows in that order and keeps the numbers through `select` and `concat`,
so the drafter always knows whose row it drafts for. Drafts are the reference tokens with a deterministic
pseudo-random subset corrupted, so acceptance lengths vary from step to step and across the batch.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.model.drafters import DFlashDrafter, DraftCache, Proposal


class NumberedCache(DraftCache):
    def __init__(self, config, batch_size, capacity, first_id):
        super().__init__(config, batch_size, capacity, torch.float32)
        self.sequence_ids = list(range(first_id, first_id + batch_size))

    def select(self, indices):
        super().select(indices)
        self.sequence_ids = [self.sequence_ids[int(i)] for i in indices]

    def concat(self, other):
        super().concat(other)
        self.sequence_ids = self.sequence_ids + other.sequence_ids


class JoiningOracle(DFlashDrafter):
    def __init__(self, config, references: list[list[int]], corrupt_every: int = 5):
        super().__init__(config)
        self.references, self.corrupt_every = references, corrupt_every  # prompt + continuation, per request
        self.next_id = 0
        self.calls = 0

    def new_cache(self, batch_size, capacity):
        cache = NumberedCache(self.config, batch_size, capacity, self.next_id)
        self.next_id += batch_size
        return cache

    def propose(self, target, block, features, ctx_lens, cache, **kwargs):
        super().propose(target, block, features, ctx_lens, cache, **kwargs)  # keeps the cache bookkeeping real
        self.calls += 1
        drafts = torch.zeros(block.shape[0], block.shape[1] - 1, dtype=torch.long)
        for row, seq in enumerate(cache.sequence_ids):
            start, reference = int(cache.lens[row]), self.references[seq]
            for k in range(1, block.shape[1]):
                position = start + k
                token = reference[position] if position < len(reference) else 0
                if (((position * 2654435761 + seq * 40503) & 0xFFFFFFFF) >> 16) % self.corrupt_every == 0:
                    token = (token + 1) % self.config.vocab_size
                drafts[row, k - 1] = token
        return Proposal(drafts)
