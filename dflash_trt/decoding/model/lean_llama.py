"""The decoding forwards of a Llama target at its GGUF precision, without transformers' Python layer code.

A CPU decoding step of the demo target (SmolLM2-135M, 30 layers) through transformers' Llama forward makes ~1,500
small torch calls (norms, RoPE, cache bookkeeping, ~50 per layer) at a few microseconds of dispatch each: about
as long as the block matmuls themselves. `LeanLlama` runs every decoder layer of a forward over a BatchKVCache
(a decoding step, a verify forward of a chain or a tree, a batch of either, a prefill chunk) as one native call,
torch.ops.dflash_cpu.llama_decoder (kernels/native/llama_decoder.cpp): q/k/v and gate/up each one block matmul
over stacked weights, and norms, RoPE, SiLU and the cache writes in C++. The embedding lookup, the rotary table,
the final norm and the output head stay transformers' own modules (a few calls per forward).

The op computes transformers' arithmetic bit for bit: the norm adds in the order of torch's CPU sum kernel and
SiLU calls torch's own vectorized exp (`build` checks both against the model's own modules before it applies), so
logits, keys and values equal the transformers forward's exactly (scheduler/prefill.py prefills through this op,
and tests compare the two). Every row's result depends on its own inputs only (batch-invariant), as lossless
speculative decoding needs.

Applies to a LlamaForCausalLM whose linear layers are all BlockQuantLinear (gguf_weights.quantize_like_gguf),
with SiLU, no biases, no sliding window, and q/k/v (and gate/up) of one bit width; elsewhere `build` says why
and the target keeps transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear

# Vector widths torch's CPU sum kernel may use (floats); `build` finds the one whose order the model's norm has.
SUM_LANES = (8, 16, 4)


@dataclass
class LeanLlama:
    model: nn.Module
    weights: list[torch.Tensor]  # per layer: input norm, qkv (codes, d, o), o, post norm, gate_up, down
    bits: list[int]  # per layer: qkv, o, gate_up, down
    dims: list[int]  # heads, kv heads, head dim, intermediate size
    eps: float
    scale: float
    lanes: int
    stacked: list[BlockQuantLinear]  # holds the stacked q/k/v and gate/up weights

    @classmethod
    def build(cls, model: nn.Module) -> tuple["LeanLlama | None", str]:
        """The lean forward of `model`, or None and why it does not apply."""
        reason = _unsupported(model)
        if reason:
            return None, reason
        config, inner = model.config, model.model
        native.load()
        lanes = norm_lanes(inner.norm, inner.norm.variance_epsilon)
        if lanes is None:
            return None, "torch's RMSNorm adds in an order the native norm does not reproduce"
        if not _silu_matches(inner.layers[0].mlp.act_fn):
            return None, "torch's SiLU rounds differently from the native one"
        weights, bits, stacked = [], [], []
        for layer in inner.layers:
            attention, mlp = layer.self_attn, layer.mlp
            qkv = BlockQuantLinear.stacked([attention.q_proj, attention.k_proj, attention.v_proj])
            gate_up = BlockQuantLinear.stacked([mlp.gate_proj, mlp.up_proj])
            stacked += [qkv, gate_up]
            weights += [layer.input_layernorm.weight.detach(), *block_tensors(qkv),
                        *block_tensors(attention.o_proj), layer.post_attention_layernorm.weight.detach(),
                        *block_tensors(gate_up), *block_tensors(mlp.down_proj)]
            bits += [qkv.bits, attention.o_proj.bits, gate_up.bits, mlp.down_proj.bits]
        attention = inner.layers[0].self_attn
        dims = [config.num_attention_heads, config.num_key_value_heads, attention.head_dim, config.intermediate_size]
        return cls(model, weights, bits, dims, float(inner.norm.variance_epsilon), float(attention.scaling), lanes,
                   stacked), ""

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor, masks: torch.Tensor, cache,
                feature_layer_ids: Sequence[int] = (), last_only: bool = False,
                logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """TargetModel.run_model over a BatchKVCache whose `prepare` returned `masks` ([B, 1, T, W] bool); logits_at
        [B]: the logits of that column of each row only (TargetModel.forward)."""
        inner = self.model.model
        hidden = inner.embed_tokens(token_ids)
        cos, sin = inner.rotary_emb(hidden, position_ids)
        slots, width = cache.forward_slots()
        out, features = torch.ops.dflash_cpu.llama_decoder(
            hidden, self.weights, self.bits, cos, sin, cache.keys, cache.values, slots, masks, width, self.dims,
            self.eps, self.scale, self.lanes, list(feature_layer_ids))
        if logits_at is not None:
            out = out[torch.arange(out.shape[0], device=out.device), logits_at][:, None]
        elif last_only:
            out = out[:, -1:]
        return self.model.lm_head(inner.norm(out)), features if feature_layer_ids else None


def _unsupported(model: nn.Module) -> str:
    """Why the lean forward cannot run `model` ("" when it can)."""
    config = model.config
    inner = getattr(model, "model", None)
    if getattr(config, "model_type", None) != "llama" or inner is None or not hasattr(inner, "rotary_emb"):
        return f"not a Llama model ({getattr(config, 'model_type', type(model).__name__)})"
    if config.hidden_act != "silu" or getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "a Llama variant (activation or biases) the native decoder does not compute"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj,
                       mlp.up_proj, mlp.down_proj)
        if not all(isinstance(p, BlockQuantLinear) for p in projections):
            return "linear layers not at GGUF precision"
        if (len({p.bits for p in projections[:3]}) > 1 or mlp.gate_proj.bits != mlp.up_proj.bits
                or attention.q_proj.out_features % 16 or attention.k_proj.out_features % 16
                or mlp.gate_proj.out_features % 16):
            return "q/k/v or gate/up of different block types (or widths) that cannot share one matmul"
    return ""


def block_tensors(layer: BlockQuantLinear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer.codes, layer.scale, layer.offset


def norm_lanes(norm: nn.Module, eps: float) -> int | None:
    """The vector width whose addition order makes the native norm equal `norm` (an RMSNorm with epsilon `eps`: the
    model's LlamaRMSNorm, a drafter's) bit for bit on probe rows, or None."""
    generator = torch.Generator().manual_seed(0)
    width = norm.weight.shape[0]
    probe = torch.randn(64, width, generator=generator) * torch.logspace(-2, 2, 64)[:, None]
    with torch.inference_mode():
        expected = norm(probe)
        for lanes in SUM_LANES:
            if width >= lanes and torch.equal(
                    torch.ops.dflash_cpu.rms_norm(probe, norm.weight.detach(), eps, lanes), expected):
                return lanes
    return None


def _silu_matches(act_fn) -> bool:
    generator = torch.Generator().manual_seed(1)
    gate, up = torch.randn(2, 8, 1536, generator=generator) * 8
    with torch.inference_mode():
        return torch.equal(torch.ops.dflash_cpu.silu_mul(gate, up), act_fn(gate) * up)
