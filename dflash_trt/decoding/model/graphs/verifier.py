"""The target with static-shape verify steps, captured in CUDA graphs per batch bucket (the torch runtime on CUDA).

`GraphedVerifier(target)` is the TargetModel the decoding loop and the scheduler take, unchanged: prefill still runs
eagerly on a DynamicCache, but the decoding cache it makes is a StaticKVCache, and every forward over it runs as a
StaticForward (static_kv_cache.py; a tree verify as a StaticTreeForward, its width padded to a bucket of node
counts): shapes depend on (batch bucket, block size or tree bucket, capacity) only and nothing is read on the
host. On CUDA, the second run of a (bucket, block size, feature layers) on the same buffers captures it in a CUDA
graph and every later one replays it: the whole target forward (embedding, every layer's projections, the
scatter of K/V, attention, MLPs, the head) becomes one launch. The first run stays eager, so shapes seen once (a
prefilled group's drafted first step before it joins the running batch, a block size the policy tries once) never pay a
capture. All graphs share one memory pool; each replay's outputs are copied out at once (another graph's replay
may reuse that memory), the live rows only. Without CUDA (or with graphs=False) the static path runs eagerly,
which is how it is tested on CPU.

What cannot be captured, and is refused (graphs=True) or left eager (graphs=None), by `capture_blockers`:
- mixture-of-experts layers on transformers' eager experts: they pick the experts a batch hits with `nonzero` and
  loop over them in Python (shapes and a host read that depend on the routing);
- dynamic and longrope RoPE: the rotary embedding compares the largest position with the original context on the
  host to choose its frequencies.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dflash_trt.decoding.model.graphs.capture import GraphPool
from dflash_trt.decoding.model.graphs.drafter import bucket_for
from dflash_trt.decoding.model.graphs.static_kv_cache import StaticForward, StaticKVCache, StaticTreeForward
from dflash_trt.decoding.model.target import TargetModel, TargetOutput
from dflash_trt.errors import CompatibilityError

HOST_READ_ROPE_TYPES = ("dynamic", "longrope")


def capture_blockers(model) -> list[str]:
    """Why a CUDA graph cannot capture this model's verify forward (empty: it can)."""
    blockers = []
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_types = {rope.get("rope_type")} if "rope_type" in rope else {
        value.get("rope_type") for value in rope.values() if isinstance(value, dict)}
    for rope_type in sorted(t for t in rope_types if t in HOST_READ_ROPE_TYPES):
        blockers.append(f"{rope_type} RoPE reads the largest position on the host")
    experts = {getattr(getattr(m, "config", None), "_experts_implementation", None) or "eager"
               for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "is_transposed")}
    if "eager" in experts:
        blockers.append("eager mixture-of-experts layers pick their experts with nonzero and a Python loop "
                        "(experts_implementation='batched_mm' avoids it)")
    return blockers


class GraphedVerifier(TargetModel):
    """A TargetModel whose decoding forwards run static-shape, replaying one CUDA graph per bucket on CUDA."""

    takes_explicit_masks = True  # a tree runs as a StaticTreeForward, its ancestor mask an input buffer

    def __init__(self, target: TargetModel, graphs: bool | None = None):
        super().__init__(target.model, target.tokenizer, target.source)
        self._draft_head = target._draft_head
        blockers = capture_blockers(self.model)
        if graphs and blockers:
            raise CompatibilityError(f"{self.source}: verify steps cannot be captured in CUDA graphs: "
                                     + "; ".join(blockers))
        self.use_graphs = (self.device.type == "cuda" and not blockers) if graphs is None else graphs
        self.blockers = blockers
        self._graphs = GraphPool()

    def batch_cache(self, prefill_cache, lengths: torch.Tensor, capacity_limit: int,
                    cache_type: type = StaticKVCache) -> StaticKVCache:
        return super().batch_cache(prefill_cache, lengths, capacity_limit, cache_type)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache,
                feature_layer_ids: Sequence[int] = (), last_only: bool = False,
                logits_at: torch.Tensor | None = None) -> TargetOutput:
        """TargetModel.forward; over a StaticKVCache (prepared for T tokens) attention_mask is unused: the static
        forward builds the masks from position_ids."""
        if not isinstance(cache, StaticKVCache):
            return super().forward(token_ids, position_ids, attention_mask, cache, feature_layer_ids, last_only,
                                   logits_at)
        if logits_at is not None:
            raise RuntimeError("logits_at is for the native decoder's forwards")  # internal invariant
        n, num_new = token_ids.shape
        block_mask = cache.take_preparation(num_new)
        tree = block_mask is not None  # a tree's width comes padded to a bucket (static_kv_cache.tree_nodes_bucket)
        key = (bucket_for(n), num_new, tuple(feature_layer_ids), tree)
        step = cache.forwards.get(key)
        if step is None:
            kind = StaticTreeForward if tree else StaticForward
            step = cache.forwards[key] = kind(self, cache, key[0], num_new, feature_layer_ids)
        if tree:
            step.load_tree(token_ids, position_ids, cache.lengths, block_mask)
        else:
            step.load(token_ids, position_ids)
        logits, features = self._run(step, cache)
        logits = logits[:n, -1:] if last_only else logits[:n]
        return TargetOutput(logits.to(torch.float32, copy=True), None if features is None else features[:n].clone())

    def _run(self, step: StaticForward, cache: StaticKVCache) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._graphs.run(step, lambda: step.run(cache), self.use_graphs)
