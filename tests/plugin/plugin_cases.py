"""Random inputs of the DFlashAttention op, shared by the plugin tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from dflash_trt.decoding.kernels.plugin.fields import AttentionFields

GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                "beta_fast": 32.0, "beta_slow": 1.0}


@dataclass(frozen=True)
class Case:
    batch: int
    block: int
    heads: int
    kv_heads: int
    head_dim: int
    ctx_rows: int
    capacity: int
    cache_lens: tuple[int, ...]
    ctx_lens: tuple[int, ...]
    theta: float
    yarn: bool

    @property
    def fields(self) -> AttentionFields:
        return AttentionFields.from_rope(self.heads, self.kv_heads, self.head_dim, self.theta,
                                         GPT_OSS_YARN if self.yarn else None)

    def __str__(self) -> str:
        return (f"B{self.batch} S{self.block} H{self.heads}/{self.kv_heads} D{self.head_dim} C{self.ctx_rows} "
                f"cache{list(self.cache_lens)} ctx{list(self.ctx_lens)} {'yarn' if self.yarn else 'rope'}")


def random_case(rng: random.Random, max_context: int = 2048) -> Case:
    """Shapes drawn over GQA ratios 1..8, head dims 64/128, batch 1..4 and total context 0..max_context."""
    kv_heads = rng.choice([1, 2, 4])
    heads = kv_heads * rng.choice([1, 2, 4, 8])
    batch = rng.randint(1, 4)
    ctx_rows = rng.choice([0, 1, 5, 16])
    totals = [rng.randint(0, max_context) for _ in range(batch)]
    ctx_lens = tuple(min(rng.randint(0, ctx_rows), t) for t in totals)
    cache_lens = tuple(t - c for t, c in zip(totals, ctx_lens))
    return Case(batch, rng.choice([1, 8, 16]), heads, kv_heads, rng.choice([64, 128]), ctx_rows,
                max(totals) + rng.randint(0, 8), cache_lens, ctx_lens, rng.choice([10000.0, 1e6, 150000.0]),
                rng.random() < 0.5)


def make_inputs(case: Case, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    b, s, h, kv, d = case.batch, case.block, case.heads, case.kv_heads, case.head_dim
    return {
        "q": randn(b, s, h, d), "k": randn(b, s, kv, d), "v": randn(b, s, kv, d),
        "ctx_k": randn(b, case.ctx_rows, kv, d), "ctx_v": randn(b, case.ctx_rows, kv, d),
        "cache_k": randn(b, kv, case.capacity, d), "cache_v": randn(b, kv, case.capacity, d),
        "cache_lens": torch.tensor(case.cache_lens, dtype=torch.int64),
        "ctx_lens": torch.tensor(case.ctx_lens, dtype=torch.int64),
    }


def clone_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in inputs.items()}
