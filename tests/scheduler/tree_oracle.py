"""A drafter with near misses, for tree verification: each slot's top-K candidates hold the request's reference
token at a rank fixed by a hash of (position, request): rank 0 (the chain's draft) about half the time, ranks 1-3
often, and absent sometimes. The chain then stops at every near miss, while a tree recovers those within its
budget. It numbers its rows like JoiningOracle, so it follows requests through joins and leaves; the real
drafter runs underneath (with top_k), so the context cache's bookkeeping is real, and its own proposals are
recorded for the context checks.
"""

from __future__ import annotations

import math

import torch
from scheduler_oracle import JoiningOracle

from dflash_trt.decoding.model.drafters import DFlashDrafter, Proposal

# rank of the reference token by hash % 8: 0-3 -> 0, 4 -> 1, 5 -> 2, 6 -> 3, 7 -> not offered
RANKS = (0, 0, 0, 0, 1, 2, 3, None)


def _hash(position: int, seq: int) -> int:
    return ((position * 2654435761 + seq * 40503) & 0xFFFFFFFF) >> 16


class NearMissOracle(JoiningOracle):
    def __init__(self, config, references: list[list[int]]):
        super().__init__(config, references)
        self.records: list[tuple[int, int, int, Proposal]] = []  # (seq, start, real slots, the real proposal)

    def propose(self, target, block, features, ctx_lens, cache, top_k: int = 0, **kwargs):
        real = DFlashDrafter.propose(self, target, block, features, ctx_lens, cache, top_k=max(top_k, 1), **kwargs)
        starts = cache.lens.tolist()  # after taking in the new context: the block's first position
        lens = kwargs.get("block_lens")
        lens = [block.shape[1]] * block.shape[0] if lens is None else lens.tolist()
        self.calls += 1
        k = max(top_k, 1)
        vocab = self.config.vocab_size
        ids = torch.zeros(block.shape[0], block.shape[1] - 1, k, dtype=torch.long)
        logprobs = torch.zeros(block.shape[0], block.shape[1] - 1, k)
        for row, seq in enumerate(cache.sequence_ids):
            self.records.append((seq, starts[row], lens[row], Proposal(real.drafts[row], topk_ids=real.topk_ids[row],
                                                                        topk_logprobs=real.topk_logprobs[row])))
            reference = self.references[seq]
            for slot in range(block.shape[1] - 1):
                position = starts[row] + slot + 1
                true = reference[position] if position < len(reference) else 0
                h = _hash(position, seq)
                others = [(true + 1 + i) % vocab for i in range(k)]
                rank = RANKS[h % 8]
                candidates = others[:k]
                if rank is not None and rank < k:
                    candidates = others[:rank] + [true] + others[rank:k - 1]
                confidence = 0.3 + 0.6 * ((h >> 3) % 64) / 63  # how peaked the slot is: varies the tree's shape
                ids[row, slot] = torch.tensor(candidates)
                logprobs[row, slot] = torch.tensor([math.log(confidence) + i * math.log(1 - confidence + 1e-3)
                                                    for i in range(k)])
        if top_k <= 0:
            return Proposal(ids[:, :, 0])
        return Proposal(ids[:, :, 0], topk_ids=ids, topk_logprobs=logprobs)
