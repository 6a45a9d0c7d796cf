"""What every drafter family shares: norms, the KV-injected attention, the MLP, the context cache, and the
forward skeleton (fuse the target features, run the layers, final norm).

A family (dflash.py, dflash2.py, ...) supplies its layer class, its extra tensors and how draft logits become
draft tokens. Module names equal the checkpoint's tensor names (no `model.` prefix), so a state dict
loads as is. A drafter has no embedding and no lm_head: it borrows the target's at run time.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from dflash_trt.decoding.kernels.attention import draft_attention, windowed_draft_attention
from dflash_trt.decoding.kernels.rope import RotaryEmbedding
from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.model.protocols import Proposal, RowSampling


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back before the weight multiply (as Qwen3/Llama do)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, config: DrafterConfig, layer_index: int):
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads,
                                                            config.num_key_value_heads, hd)
        self.window = config.layer_windows[layer_index]
        self.causal = config.layer_causal[layer_index]
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def project(self, h: torch.Tensor, ctx: torch.Tensor):
        """(q, k, v) of normed block states h [B,S,D] and (ctx_k, ctx_v) of context rows ctx [B,C,D], as
        [B, rows, heads, head_dim], before RoPE. KV injection: the same k_proj/v_proj project both the context
        and the block (the context is NOT normed by input_layernorm). Inference and training both use it."""
        batch, block_size, _ = h.shape
        num_ctx = ctx.shape[1]
        q = self.q_norm(self.q_proj(h).view(batch, block_size, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(h).view(batch, block_size, self.num_kv_heads, self.head_dim))
        v = self.v_proj(h).view(batch, block_size, self.num_kv_heads, self.head_dim)
        ctx_k = self.k_norm(self.k_proj(ctx).view(batch, num_ctx, self.num_kv_heads, self.head_dim))
        ctx_v = self.v_proj(ctx).view(batch, num_ctx, self.num_kv_heads, self.head_dim)
        return q, k, v, ctx_k, ctx_v

    def forward(self, h, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope, block_lens=None):
        """h [B,S,D] normed block states; ctx [B,C,D] fused context (NOT normed by input_layernorm)."""
        batch, block_size, _ = h.shape
        q, k, v, ctx_k, ctx_v = self.project(h, ctx)
        if self.window is None and not self.causal:
            out = draft_attention(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, rope, block_lens)
        else:
            out = windowed_draft_attention(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, rope,
                                           self.window, self.causal, block_lens)
        return self.o_proj(out.reshape(batch, block_size, -1))


class MLP(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterBase(nn.Module):
    """Block-diffusion drafter conditioned on target features through KV injection.

    Subclasses set `layer_class` (built as layer_class(config, index)) and implement `choose_drafts`.
    """

    layer_class: type[nn.Module]
    family: str
    # Whether propose() draws its drafts (and so needs each row's temperature and generator).
    samples_drafts = False
    # Any block size can be drafted (an exported graph has one fixed size).
    static_block_size = None
    # propose(..., top_k=K) gives each slot's top-K candidates (tree verification); a family may say no.
    proposes_top_k = True
    # A draft call that only takes in context may pass the anchor alone (no drafts, no output head).
    absorb_block = 1
    # The layers as one native call (native_layers.NativeDraftLayers; set where they apply, for Q8_0 layers).
    native_layers = None

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(config.num_target_features * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rope = RotaryEmbedding.from_config(config.head_dim, config.rope_theta, config.rope_scaling)

    def new_cache(self, batch_size: int, capacity: int) -> ContextCache:
        param = next(self.parameters())
        return ContextCache(self.config, batch_size, capacity, param.dtype, param.device)

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [B,C,K*D] (K layers concatenated) -> context rows [B,C,D]."""
        return self.hidden_norm(self.fc(features))

    def _fused_context(self, features: torch.Tensor, ctx_lens: torch.Tensor) -> torch.Tensor:
        """fuse_context of the rows each sequence has (rows >= ctx_lens[b] are padding: zero rows, as fuse_context
        makes of the zero features that pad them). A catch-up or a group of newcomers pads every sequence to the
        longest backlog, and `fc` over K target layers is most of what a context row costs, so on CPU, when a
        quarter or more of the rows are padding, only the real ones are projected. (CUDA keeps the padded call:
        counting the rows would synchronize, and graph capture cannot.)"""
        batch, width = features.shape[:2]
        if (features.device.type != "cpu" or batch < 2 or torch.is_grad_enabled()
                or int(ctx_lens.sum()) >= 0.75 * batch * width):
            return self.fuse_context(features)
        real = torch.arange(width)[None, :] < ctx_lens[:, None]
        ctx = features.new_zeros(batch, width, self.config.hidden_size)
        ctx[real] = self.fuse_context(features[real])
        return ctx

    def embed_block(self, target, block: torch.Tensor) -> torch.Tensor:
        """The target's embeddings of the block, times input_embedding_scale."""
        embeds = target.embed(block)
        scale = self.config.input_embedding_scale
        return embeds if scale == 1.0 else embeds * scale

    def draft_logits(self, target, hidden: torch.Tensor) -> torch.Tensor:
        """Target-head logits of drafter states, with output_multiplier and final_logit_softcapping (fp32)."""
        logits = target.draft_logits(hidden).float()
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward(self, block_embeds: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: ContextCache, block_lens: torch.Tensor | None = None) -> torch.Tensor:
        """One draft forward.

        block_embeds [B,S,D]: target embeddings of [last committed token, MASK x (S-1)];
        features [B,C,K*D]: target features of the new context rows (rows >= ctx_lens[b] are padding);
        block_lens [B]: valid slots per row (a shortened last block; default S);
        cache: appended with the new context. Returns the final-normed block states [B,S,D].
        """
        if cache.capacity < int((cache.lens + ctx_lens).max()):
            raise ValueError("draft cache too small for the context")  # the decoding loop sizes it
        # The drafter may run in another precision than the target (e.g. bf16 beside a float32 target).
        dtype = self.norm.weight.dtype
        ctx = self._fused_context(features.to(dtype), ctx_lens)
        x = block_embeds.to(dtype)
        if self.native_layers is not None and not torch.is_grad_enabled():
            x = self.native_layers(x, ctx, cache, ctx_lens, block_lens, self.rope)
        else:
            for layer, cache_k, cache_v in zip(self.layers, cache.k, cache.v):
                x = layer(x, ctx, cache_k, cache_v, cache.lens, ctx_lens, self.rope, block_lens)
        cache.lens = cache.lens + ctx_lens
        return self.norm(x)

    @torch.inference_mode()
    def propose(self, target, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: ContextCache, block_lens: torch.Tensor | None = None,
                sampling: Sequence[RowSampling] | None = None, top_k: int = 0) -> Proposal:
        """Draft tokens for block slots 1..S-1 of block [B,S] = [last committed token, MASK...].

        Slot k predicts position start + k. The target lends its embedding and output head. Returns a Proposal:
        the drafts, and for a family that draws them the candidates and q they were drawn from
        (protocols.Drafter; every runtime's drafter provides the same). top_k > 0 adds each slot's top-K
        candidates for tree verification.
        """
        hidden = self(self.embed_block(target, block), features, ctx_lens, cache, block_lens)
        return self.choose_drafts(target, hidden[:, 1:], block[:, 0], sampling, block_lens, top_k)

    def choose_drafts(self, target, hidden: torch.Tensor, anchors: torch.Tensor,
                      sampling: Sequence[RowSampling] | None, block_lens: torch.Tensor | None,
                      top_k: int = 0) -> Proposal:
        """Drafts for slots 1..S-1 from their final states hidden [B,S-1,D]; slots >= block_lens are padding.
        top_k > 0: also each slot's top-K candidates (Proposal.topk_ids, topk_logprobs or children)."""
        raise NotImplementedError

    def init_as_dflash(self) -> None:
        """Initialise a fresh drafter so it drafts what a DFlash drafter of the same layers drafts (training starts
        there; a no-op for DFlash itself, DFlash2 neutralises its extra parts)."""

    @staticmethod
    def checkpoint_aliases() -> dict[str, str]:
        """Checkpoint tensor names that differ from this module's: published name -> module name."""
        return {}

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def ranked_top_k(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, logprobs) of the k best entries of the last axis, best first, exact ties by ascending id: the same
    order as argmax (first maximum), so rank 0 is always the chain's draft and the tree is deterministic."""
    k = min(k, logprobs.shape[-1])
    values, ids = torch.topk(logprobs, k, dim=-1)
    ids, order = ids.sort(dim=-1)
    values = values.gather(-1, order)
    values, order = values.sort(dim=-1, descending=True, stable=True)
    return ids.gather(-1, order), values


def layer_shapes(config: DrafterConfig, index: int) -> dict[str, tuple[int, ...]]:
    """The tensors of draft layer `index` that every family has, with their shapes."""
    d, hd = config.hidden_size, config.head_dim
    q_out, kv_out, inter = config.num_attention_heads * hd, config.num_key_value_heads * hd, config.intermediate_size
    p = f"layers.{index}."
    shapes = {
        p + "input_layernorm.weight": (d,),
        p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (q_out, d),
        p + "self_attn.k_proj.weight": (kv_out, d),
        p + "self_attn.v_proj.weight": (kv_out, d),
        p + "self_attn.o_proj.weight": (d, q_out),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_proj.weight": (inter, d),
        p + "mlp.up_proj.weight": (inter, d),
        p + "mlp.down_proj.weight": (d, inter),
    }
    if config.attention_bias:
        shapes.update({p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                       p + "self_attn.v_proj.bias": (kv_out,), p + "self_attn.o_proj.bias": (d,)})
    return shapes


def global_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    d = config.hidden_size
    return {"fc.weight": (d, config.num_target_features * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
