"""A DFlash drafter's layers as one native call, where its linear layers are Q8_0 blocks (int8_weights.py).

Beside a target at its GGUF precision a draft of the demo drafter (two layers) was ~2.2 ms on one core, of which
~0.3 ms were its matmuls and ~1.5 ms the ~150 small torch calls around them (norms, RoPE, the context cache's
append, the attention's concatenations and masks). `NativeDraftLayers` runs all the layers of a draft forward as
torch.ops.dflash_cpu.draft_decoder (kernels/native/draft_decoder.cpp): for every layer the block's q, the block's
and the new context rows' k/v (two block matmuls), q_norm/k_norm, RoPE, the cache append, the attention and the
MLP. The context projection (fc, hidden_norm), the final norm and the output head stay the drafter's own modules.

Its states equal the torch forward's up to float rounding (the attention sums in its own order), so a draft may
differ from the torch forward's where two tokens nearly tie. Drafts are proposals the target verifies: the output
is the target's either way (lossless).

Applies to a DFlash (v1) drafter in float32 on CPU whose layers are all full attention over the context (no
sliding window, not causal) and whose q/k/v, o, gate/up and down are BlockQuantLinear, k/v and gate/up each of one
block type; elsewhere `build` says why and the drafter keeps its torch forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.kernels.block_quant import LANES, BlockQuantLinear
from dflash_trt.decoding.kernels.rope import RotaryEmbedding
from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.model.drafters.dflash import DraftLayer
from dflash_trt.decoding.model.lean_llama import SUM_LANES, block_tensors, norm_lanes


@dataclass
class NativeDraftLayers:
    weights: list[torch.Tensor]  # per layer, in draft_decoder.cpp's order
    bits: list[int]  # per layer: q, kv, o, gate_up, down
    dims: list[int]  # heads, kv heads, head dim, intermediate size
    eps: float
    scale: float
    lanes: int
    stacked: list[BlockQuantLinear]  # holds the stacked k/v and gate/up weights

    @classmethod
    def build(cls, drafter) -> tuple["NativeDraftLayers | None", str]:
        """The native layers of `drafter` (a DrafterBase), or None and why they do not apply."""
        reason = _unsupported(drafter)
        if reason:
            return None, reason
        native.load()
        config = drafter.config
        first = drafter.layers[0]
        lanes = norm_lanes(first.input_layernorm, first.input_layernorm.eps) or SUM_LANES[0]
        weights, bits, stacked = [], [], []
        for layer in drafter.layers:
            attention, mlp = layer.self_attn, layer.mlp
            kv = BlockQuantLinear.stacked([attention.k_proj, attention.v_proj])
            gate_up = BlockQuantLinear.stacked([mlp.gate_proj, mlp.up_proj])
            stacked += [kv, gate_up]
            weights += [layer.input_layernorm.weight.detach(), *block_tensors(attention.q_proj),
                        *block_tensors(kv), *block_tensors(attention.o_proj), attention.q_norm.weight.detach(),
                        attention.k_norm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                        *block_tensors(gate_up), *block_tensors(mlp.down_proj)]
            bits += [attention.q_proj.bits, kv.bits, attention.o_proj.bits, gate_up.bits, mlp.down_proj.bits]
        dims = [config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.intermediate_size]
        return cls(weights, bits, dims, float(first.input_layernorm.eps), config.head_dim ** -0.5, lanes, stacked), ""

    def __call__(self, x: torch.Tensor, ctx: torch.Tensor, cache: ContextCache, ctx_lens: torch.Tensor,
                 block_lens: torch.Tensor | None, rope: RotaryEmbedding) -> torch.Tensor:
        """The layers' output for block states x [B,S,D] and fused context rows ctx [B,C,D] (DrafterBase.forward);
        appends the new context to `cache` (its lengths are the caller's to advance)."""
        batch, slots, _ = x.shape
        cache_lens = cache.lens
        ctx_pos = cache_lens[:, None] + torch.arange(ctx.shape[1])[None, :]
        block_pos = (cache_lens + ctx_lens)[:, None] + torch.arange(slots)[None, :]
        block_cos, block_sin = rope.cos_sin(block_pos)
        ctx_cos, ctx_sin = rope.cos_sin(ctx_pos)
        if block_lens is None:
            block_lens = torch.full((batch,), slots, dtype=torch.long)
        return torch.ops.dflash_cpu.draft_decoder(
            x.contiguous(), ctx.contiguous(), self.weights, self.bits, block_cos, block_sin, ctx_cos, ctx_sin,
            cache.k, cache.v, cache_lens.contiguous(), ctx_lens.contiguous(), block_lens.contiguous(), self.dims,
            self.eps, self.scale, self.lanes)


def _unsupported(drafter) -> str:
    """Why the native layers cannot run `drafter` ("" when they can)."""
    if drafter.device.type != "cpu" or drafter.norm.weight.dtype != torch.float32:
        return "not a float32 drafter on CPU"
    if drafter.config.attention_bias:
        return "attention biases"
    for layer in drafter.layers:
        if type(layer) is not DraftLayer:
            return f"{type(layer).__name__} layers (the native layers compute DFlash's)"
        attention, mlp = layer.self_attn, layer.mlp
        if attention.window is not None or attention.causal:
            return "sliding-window or causal draft layers"
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj,
                       mlp.up_proj, mlp.down_proj)
        if not all(isinstance(p, BlockQuantLinear) for p in projections):
            return "linear layers not as blocks"
        if (attention.k_proj.bits != attention.v_proj.bits or mlp.gate_proj.bits != mlp.up_proj.bits
                or attention.k_proj.out_features % LANES or mlp.gate_proj.out_features % LANES):
            return "k/v or gate/up of different block types (or widths) that cannot share one matmul"
    return ""
