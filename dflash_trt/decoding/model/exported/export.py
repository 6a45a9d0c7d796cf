"""Export a drafter (DFlash or DFlash2) to ONNX with one DFlashAttention plugin node per layer.

Graph (B, C, Cmax and S dynamic; S <= the trained block size):
  inputs  block_embeds [B,S,D], features [B,C,K*D], cache_lens [B] int32, ctx_lens [B] int32,
          cache_k_<i>, cache_v_<i> [B,Hkv,Cmax,Dh] for every layer i
  outputs hidden [B,S,D] (final-normed block states), cache_k_out_<i>, cache_v_out_<i>
The target's embedding and lm_head stay outside, as for the PyTorch drafter, and so does what turns the
hidden states into drafts (argmax, or DFlash2's candidate selector walk: a short sequential loop that
samples): the runtimes run it on the host with the drafter's own `choose_drafts` (exported.head).
DFlash2's convolutions act along the block axis only and are plain ops inside the graph.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from dflash_trt.decoding.kernels.plugin.fields import AttentionFields, fields_to_list
from dflash_trt.decoding.kernels.plugin.torch_op import draft_attention_op, onnx_translation
from dflash_trt.decoding.model.config import DrafterConfig

OPSET = 20


def attention_fields(config: DrafterConfig) -> AttentionFields:
    """Plugin fields of a drafter's attention (same for every layer)."""
    return AttentionFields.from_rope(config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                                     config.rope_theta, config.rope_scaling)


def cache_names(num_layers: int, suffix: str = "") -> list[str]:
    return [f"cache_{kv}{suffix}_{i}" for i in range(num_layers) for kv in ("k", "v")]


class ExportGraph(nn.Module):
    """DFlashDrafter.forward with the attention as the plugin op and the caches as inputs/outputs."""

    def __init__(self, drafter):
        super().__init__()
        self.drafter = drafter
        self.fields = fields_to_list(attention_fields(drafter.config))

    def _attention(self, attn, h, ctx, cache_k, cache_v, cache_lens, ctx_lens):
        batch, block, _ = h.shape
        num_ctx = ctx.shape[1]
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        q = attn.q_norm(attn.q_proj(h).view(batch, block, heads, dim))
        k = attn.k_norm(attn.k_proj(h).view(batch, block, kv_heads, dim))
        v = attn.v_proj(h).view(batch, block, kv_heads, dim)
        ctx_k = attn.k_norm(attn.k_proj(ctx).view(batch, num_ctx, kv_heads, dim))
        ctx_v = attn.v_proj(ctx).view(batch, num_ctx, kv_heads, dim)
        out, cache_k, cache_v = draft_attention_op(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens,
                                                   self.fields)
        return attn.o_proj(out.reshape(batch, block, heads * dim)), cache_k, cache_v

    def forward(self, block_embeds, features, cache_lens, ctx_lens, *caches):
        d = self.drafter
        ctx = d.fuse_context(features.to(block_embeds.dtype))
        x = block_embeds
        new_caches = []
        for i, layer in enumerate(d.layers):
            def attend(h, attn=layer.self_attn, cache_k=caches[2 * i], cache_v=caches[2 * i + 1]):
                out, cache_k, cache_v = self._attention(attn, h, ctx, cache_k, cache_v, cache_lens, ctx_lens)
                new_caches.extend((cache_k, cache_v))
                return out
            x = layer.compute(x, attend)  # the family's own layer, with the plugin as its attention
        return (d.norm(x), *new_caches)


def sample_inputs(config: DrafterConfig, dtype: torch.dtype, batch: int = 2, num_ctx: int = 3,
                  capacity: int = 40) -> tuple[torch.Tensor, ...]:
    """Example inputs for tracing (sizes chosen distinct so no dimension is specialised)."""
    d, s = config.hidden_size, config.block_size
    caches = [torch.zeros(batch, config.num_key_value_heads, capacity, config.head_dim, dtype=dtype)
              for _ in range(2 * config.num_hidden_layers)]
    return (torch.zeros(batch, s, d, dtype=dtype), torch.zeros(batch, num_ctx, config.num_target_features * d,
                                                                dtype=dtype),
            torch.zeros(batch, dtype=torch.int32), torch.full((batch,), num_ctx, dtype=torch.int32), *caches)


def export_drafter(drafter, out_path: str | Path) -> Path:
    """Write the ONNX graph of a loaded drafter (in its parameters' dtype) to out_path; checks it with onnx."""
    import onnx

    from dflash_trt.decoding.model.drafters.support import check_runtime

    config = drafter.config
    check_runtime("onnx", config)  # the plugin node attends to every context row, without a mask
    dtype = next(drafter.parameters()).dtype
    batch, num_ctx, capacity = torch.export.Dim("batch"), torch.export.Dim("num_ctx"), torch.export.Dim("capacity")
    # The block may be shorter than the trained one: the last block of a generation shrinks to what remains.
    block = torch.export.Dim("block", min=2, max=max(config.block_size, 2))
    cache_shape = {0: batch, 2: capacity}
    # *caches is one varargs tuple for torch.export: its shapes nest the same way.
    dynamic = ({0: batch, 1: block}, {0: batch, 1: num_ctx}, {0: batch}, {0: batch},
               tuple([cache_shape] * (2 * config.num_hidden_layers)))
    names = ["block_embeds", "features", "cache_lens", "ctx_lens", *cache_names(config.num_hidden_layers)]
    with warnings.catch_warnings():  # the exporter warns about axis names it merges; the graph is unaffected
        warnings.simplefilter("ignore", UserWarning)
        program = torch.onnx.export(
            ExportGraph(drafter).eval(), sample_inputs(config, dtype), dynamo=True, opset_version=OPSET,
            dynamic_shapes=dynamic, input_names=names,
            output_names=["hidden", *cache_names(config.num_hidden_layers, "_out")],
            custom_translation_table={torch.ops.dflash.draft_attention.default: onnx_translation},
            verbose=False)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(program.model_proto, out)
    onnx.checker.check_model(str(out))
    return out


def export_drafter_onnx(drafter_dir: str | Path, out_path: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Load the drafter at drafter_dir and export it (entry point of the engine builder's drafter-onnx step)."""
    from dflash_trt.decoding.model.drafters import load_drafter

    return export_drafter(load_drafter(drafter_dir, dtype=dtype), out_path)
