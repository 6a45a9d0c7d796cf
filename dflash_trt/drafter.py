"""The DFlash drafter in PyTorch: published-checkpoint compatible, with a per-sequence context cache.

Module names equal the checkpoint's tensor names (no `model.` prefix), so a state dict loads as is.
The drafter has no embedding and no lm_head: it borrows the target's at run time.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .attention import draft_attention
from .checkpoint import check_tensors, load_state_dict, save_state_dict
from .config import CONFIG_NAME, DrafterConfig
from .cpu_linear import pack_linear_layers
from .errors import ConfigError
from .rope import RotaryEmbedding


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


class DraftCache:
    """Context K/V of every draft layer, per sequence: k[i], v[i] are [B, Hkv, capacity, Dh].

    Only context rows persist; a block's own K/V are never written, so nothing needs cropping after a
    draft. Invariant kept by the decoding loop: lens[b] + new context rows == the block's start position.
    """

    def __init__(self, config: DrafterConfig, batch_size: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        shape = (batch_size, config.num_key_value_heads, capacity, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.lens = torch.zeros(batch_size, dtype=torch.int64, device=device)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def select(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at `indices` (finished sequences leave the batch)."""
        self.k = [t[indices] for t in self.k]
        self.v = [t[indices] for t in self.v]
        self.lens = self.lens[indices]


class DraftAttention(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads,
                                                            config.num_key_value_heads, hd)
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, h, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope):
        """h [B,S,D] normed block states; ctx [B,C,D] fused context (NOT normed by input_layernorm)."""
        batch, block_size, _ = h.shape
        num_ctx = ctx.shape[1]
        q = self.q_norm(self.q_proj(h).view(batch, block_size, self.num_heads, self.head_dim))
        # KV injection: the same k_proj/v_proj project both the context and the block.
        k = self.k_norm(self.k_proj(h).view(batch, block_size, self.num_kv_heads, self.head_dim))
        v = self.v_proj(h).view(batch, block_size, self.num_kv_heads, self.head_dim)
        ctx_k = self.k_norm(self.k_proj(ctx).view(batch, num_ctx, self.num_kv_heads, self.head_dim))
        ctx_v = self.v_proj(ctx).view(batch, num_ctx, self.num_kv_heads, self.head_dim)
        out = draft_attention(q, k, v, ctx_k, ctx_v, cache_k, cache_v, cache_lens, ctx_lens, rope)
        return self.o_proj(out.reshape(batch, block_size, -1))


class MLP(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, ctx, cache_k, cache_v, cache_lens, ctx_lens, rope):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cache_k, cache_v, cache_lens, ctx_lens, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """Block-diffusion drafter conditioned on target features through KV injection."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(config.num_target_features * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rope = RotaryEmbedding.from_config(config.head_dim, config.rope_theta, config.rope_scaling)

    def new_cache(self, batch_size: int, capacity: int) -> DraftCache:
        param = next(self.parameters())
        return DraftCache(self.config, batch_size, capacity, param.dtype, param.device)

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [B,C,K*D] (K layers concatenated) -> context rows [B,C,D]."""
        return self.hidden_norm(self.fc(features))

    def forward(self, block_embeds: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: DraftCache) -> torch.Tensor:
        """One draft forward.

        block_embeds [B,S,D]: target embeddings of [last committed token, MASK x (S-1)];
        features [B,C,K*D]: target features of the new context rows (rows >= ctx_lens[b] are padding);
        cache: appended with the new context. Returns the final-normed block states [B,S,D].
        """
        if cache.capacity < int((cache.lens + ctx_lens).max()):
            raise ValueError("draft cache too small for the context")  # the decoding loop sizes it
        ctx = self.fuse_context(features.to(block_embeds.dtype))
        x = block_embeds
        for layer, cache_k, cache_v in zip(self.layers, cache.k, cache.v):
            x = layer(x, ctx, cache_k, cache_v, cache.lens, ctx_lens, self.rope)
        cache.lens = cache.lens + ctx_lens
        return self.norm(x)

    @torch.inference_mode()
    def propose(self, target, block: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                cache: DraftCache) -> torch.Tensor:
        """Draft tokens [B, S-1] for block slots 1..S-1 of block [B,S] = [last committed token, MASK...].

        Slot k predicts position start + k. The target lends its embedding and output head.
        This is the interface the decoding loop uses; other runtimes (onnx, tensorrt) provide the same.
        """
        hidden = self(target.embed(block), features, ctx_lens, cache)
        return torch.argmax(target.draft_logits(hidden[:, 1:]).float(), dim=-1)

    # The reference project's Python API (AutoModel-style loading, spec_generate); see hf_api.py.
    @classmethod
    def from_pretrained(cls, path, dtype="auto", device_map=None, **kwargs) -> "DFlashDrafter":
        """Load a local drafter directory: `DFlashDrafter.from_pretrained(dir, dtype=..., device_map=...)`."""
        from .hf_api import from_pretrained

        return from_pretrained(path, dtype=dtype, device_map=device_map, **kwargs)

    def spec_generate(self, target, input_ids, max_new_tokens, stop_token_ids=None, temperature=0.0,
                      **kwargs) -> torch.Tensor:
        """Speculative generation with `target` (a Hugging Face causal LM); returns prompt + new tokens [1, L+N]."""
        from .hf_api import spec_generate

        return spec_generate(self, target, input_ids, max_new_tokens, stop_token_ids, temperature, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a published drafter checkpoint with its shape."""
    d, hd = config.hidden_size, config.head_dim
    q_out, kv_out, inter = config.num_attention_heads * hd, config.num_key_value_heads * hd, config.intermediate_size
    shapes = {"fc.weight": (d, config.num_target_features * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({
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
        })
        if config.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                           p + "self_attn.v_proj.bias": (kv_out,), p + "self_attn.o_proj.bias": (d,)})
    return shapes


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> DFlashDrafter:
    """Load a drafter directory in the published DFlash format (config.json + safetensors)."""
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: drafter directory not found")
    config = DrafterConfig.from_file(directory / CONFIG_NAME)
    tensors, source = load_state_dict(directory)
    check_tensors(tensors, expected_shapes(config), source)
    drafter = DFlashDrafter(config)
    drafter.load_state_dict(tensors, strict=True)
    drafter = drafter.to(device=device, dtype=dtype).eval()
    pack_linear_layers(drafter)  # CPU float32 inference: see cpu_linear.py
    return drafter


def save_drafter(drafter: DFlashDrafter, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write `drafter` in the published format (config.json + model.safetensors)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.to(dtype) if dtype else t) for name, t in drafter.state_dict().items()}
    save_state_dict(tensors, directory)
    (directory / CONFIG_NAME).write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
