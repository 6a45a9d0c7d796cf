"""Prefix caching: prompt prefixes that repeat (a system prompt, a chat's earlier turns) are computed once.

A prompt is cut into blocks of `block_tokens` tokens; block i is keyed by a hash chain over blocks 0..i (the
key of a block depends on everything before it, as in vLLM and nano-vllm), and the stored tokens are compared
on a match, so a hash collision can never reuse a wrong block. For each cached block it holds what a prefill
of those positions produces and what decoding later reads:

- the target's keys and values of every layer at those positions (sliding-window layers too: a prefill cache
  keeps every position, so the block is reused as a full prefill would have left it);
- the target's layer features at those positions, which the drafter's context is built from (DFlash's KV
  injection projects each context row on its own; DFlash2 and sliding-window drafters take the same rows). A
  hit hands the drafter exactly the rows a full prefill hands it, which is what keeps DFlash's acceptance:
  caching only the target's KV would leave the drafter blind to the reused prefix.

A request whose prompt starts with cached blocks gets their KV and features copied into its own prefill and
computes only the rest; at least its last prompt token is always computed (the first output token needs its
logits). A finished request's answer is cached as well (prefill.store_answer: the next turn of a chat resends
it), from the KV of its batch row and the features it recorded while it ran. Blocks are copied in and out, never
shared, so a block can be evicted while a request that used it is still running, and the KV bound of the
scheduler (max_kv_tokens) is unchanged. The cache holds at most
`max_bytes` of target KV; when it needs room it evicts the least recently used blocks (a prefix's blocks are touched
from the last to the first, so the deepest go first and no block is kept without its parent being more recent).
The drafter features of the cached positions come on top of that budget (`bytes` counts both): a DFlash server and
a plain one given the same budget cache the same positions, so drafting never costs prefix hits. The features are
the drafter's memory, like its context cache beside the target's KV (max_kv_tokens also bounds positions, not
bytes): on the demo pair they add a quarter to the KV's bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from dflash_trt.errors import DFlashError


@dataclass
class CachedBlock:
    """One block of a prompt: its tokens, its parent's key, the target's KV per layer [H, n, D] and the
    target's features [n, F] (None without a drafter); nbytes: all of them, kv_bytes: the KV's (the budget's)."""

    key: int
    parent: int | None
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    features: torch.Tensor | None
    nbytes: int
    kv_bytes: int


@dataclass
class PrefixHit:
    """The cached blocks a prompt starts with, in order; `num_tokens` prompt tokens they cover."""

    blocks: list[CachedBlock]

    @property
    def num_tokens(self) -> int:
        return sum(len(block.tokens) for block in self.blocks)

    def keys(self, layer: int) -> torch.Tensor:
        """[1, H, num_tokens, D] keys of `layer` over the hit."""
        return torch.cat([block.keys[layer] for block in self.blocks], dim=1)[None]

    def values(self, layer: int) -> torch.Tensor:
        return torch.cat([block.values[layer] for block in self.blocks], dim=1)[None]

    def features(self) -> torch.Tensor | None:
        """[1, num_tokens, F] target features over the hit (None when the blocks hold none)."""
        if any(block.features is None for block in self.blocks):
            return None
        return torch.cat([block.features for block in self.blocks], dim=0)[None]


class PrefixCache:
    """Prompt-prefix blocks with their target KV and features, within a budget of KV bytes (module docstring)."""

    def __init__(self, max_bytes: int, block_tokens: int = 16):
        if max_bytes < 1:
            raise DFlashError(f"prefix cache: max_bytes must be >= 1, got {max_bytes} (no cache: pass none)")
        if block_tokens < 1:
            raise DFlashError(f"prefix cache: block_tokens must be >= 1, got {block_tokens}")
        self.max_bytes, self.block_tokens = max_bytes, block_tokens
        self.blocks: OrderedDict[int, CachedBlock] = OrderedDict()  # least recently used first
        self.bytes = 0  # what the blocks hold: target KV and drafter features
        self.kv_bytes = 0  # of which the target KV, bounded by max_bytes
        self.queries_tokens = 0  # prompt tokens looked up (every admitted prompt)
        self.hits_tokens = 0  # of those, tokens served from the cache

    def chain_keys(self, prompt: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
        """(key, tokens) of each full block of `prompt`, in order."""
        keys, parent = [], None
        for start in range(0, len(prompt) - self.block_tokens + 1, self.block_tokens):
            tokens = tuple(int(t) for t in prompt[start:start + self.block_tokens])
            parent = hash((parent, tokens))
            keys.append((parent, tokens))
        return keys

    def match(self, prompt: Sequence[int]) -> PrefixHit:
        """The longest chain of cached blocks `prompt` starts with, leaving at least its last token to compute;
        marks the blocks used. The scheduler counts what it used (`record`)."""
        found: list[CachedBlock] = []
        parent = None
        for key, tokens in self.chain_keys(prompt[:-1]):
            block = self.blocks.get(key)
            if block is None or block.tokens != tokens or block.parent != parent:
                break
            found.append(block)
            parent = key
        self._touch(found)
        return PrefixHit(found)

    def record(self, prompt_tokens: int, reused_tokens: int) -> None:
        """Count one admitted prompt: its tokens, and how many of them a hit served."""
        self.queries_tokens += prompt_tokens
        self.hits_tokens += reused_tokens

    def insert(self, prompt: Sequence[int], keys: list[torch.Tensor], values: list[torch.Tensor],
               features: torch.Tensor | None) -> None:
        """Store the full blocks of a prefilled prompt not cached yet. keys/values: per layer [H, L, D] over the
        prompt's L positions; features [L, F] or None. Copies what it keeps."""
        chain = self.chain_keys(prompt)
        parent = None
        for index, (key, tokens) in enumerate(chain):
            if key not in self.blocks:
                span = slice(index * self.block_tokens, (index + 1) * self.block_tokens)
                block_keys = [k[:, span].clone() for k in keys]
                block_values = [v[:, span].clone() for v in values]
                block_features = features[span].clone() if features is not None else None
                kv_bytes = sum(t.numel() * t.element_size() for t in block_keys + block_values)
                nbytes = kv_bytes + (block_features.numel() * block_features.element_size()
                                     if block_features is not None else 0)
                if kv_bytes > self.max_bytes or not self._make_room(kv_bytes, protect=parent):
                    return  # the rest of the chain would hang on a block that is not there
                self.blocks[key] = CachedBlock(key, parent, tokens, block_keys, block_values, block_features,
                                               nbytes, kv_bytes)
                self.bytes += nbytes
                self.kv_bytes += kv_bytes
            parent = key
        self._touch([self.blocks[key] for key, _ in chain if key in self.blocks])

    def clear(self) -> None:
        self.blocks.clear()
        self.bytes = self.kv_bytes = 0

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def _touch(self, blocks: list[CachedBlock]) -> None:
        for block in reversed(blocks):  # the first block of a prefix ends up the most recent
            self.blocks.move_to_end(block.key)

    def _make_room(self, kv_bytes: int, protect: int | None) -> bool:
        """Evict least recently used blocks until kv_bytes more KV fit; never the block `protect` (the parent of the
        one being added). False when it cannot make room."""
        while self.kv_bytes + kv_bytes > self.max_bytes:
            victim = next((key for key in self.blocks if key != protect), None)
            if victim is None:
                return False
            evicted = self.blocks.pop(victim)
            self.bytes -= evicted.nbytes
            self.kv_bytes -= evicted.kv_bytes
        return True
