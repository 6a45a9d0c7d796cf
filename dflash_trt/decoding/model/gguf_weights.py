"""A GGUF target's linear layers at their shipped precision (kernels/block_quant.py), instead of float32.

Transformers loads a GGUF by dequantizing every tensor to float; `quantize_like_gguf` then replaces the
model's linear layers (attention, MLP, output head) by BlockQuantLinear modules built from the GGUF's own blocks:
its codes, its fp16 block scales and, for Q4_1, its block minimums. The token embedding stays the float
table transformers made (a lookup reads a few rows, not the table; Q8_0 dequantizes exactly to float32).

Block layouts (ggml), 32 weights per block, little-endian:
  Q4_0: fp16 d, 16 bytes of nibbles; w = d * (q - 8)
  Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
  Q8_0: fp16 d, 32 int8; w = d * q
Nibble byte j holds weight j (low nibble) and weight j + 16 (high nibble).

Every replaced layer is checked against the float weight transformers loaded (same rows, same values up to
float32 rounding), so a wrong block layout or row order fails at load with a clear message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from dflash_trt.decoding.kernels.block_quant import GROUP, BlockQuantLinear, QuantBlocks
from dflash_trt.errors import ConfigError

# GGUF tensor name (inside blk.N.) -> module path inside a Hugging Face Llama decoder layer.
LLAMA_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
SUPPORTED_TYPES = ("Q4_0", "Q4_1", "Q8_0")
# How far a rebuilt weight may be from transformers' dequantized one (both float32 of the same fp16 scales).
LOAD_CHECK_TOLERANCE = 1e-5


def decode_blocks(raw: np.ndarray, kind: str) -> QuantBlocks:
    """The blocks of a GGUF tensor: raw [N, blocks * block_bytes] uint8, kind its type."""
    rows = raw.shape[0]
    if kind == "Q4_0":
        blocks = raw.reshape(rows, -1, 18)
        d = _fp16(blocks[..., 0:2])
        return QuantBlocks(_nibbles(blocks[..., 2:18]), d, -8 * d, bits=4)
    if kind == "Q4_1":
        blocks = raw.reshape(rows, -1, 20)
        return QuantBlocks(_nibbles(blocks[..., 4:20]), _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4]), bits=4)
    if kind == "Q8_0":
        blocks = raw.reshape(rows, -1, 34)
        d = _fp16(blocks[..., 0:2])
        # Unsigned codes q + 128: d * q = d * (q + 128) - 128d, exactly (-128d is a float16 value too).
        shifted = torch.from_numpy(blocks[..., 2:34].copy().view(np.int8).astype(np.int16) + 128).reshape(rows, -1)
        return QuantBlocks(shifted.to(torch.uint8), d, -128 * d, bits=8)
    raise ConfigError(f"GGUF tensor type {kind} has no kernel here (supported: {', '.join(SUPPORTED_TYPES)}); "
                      "load the target with --weights float")


def _fp16(two_bytes: np.ndarray) -> torch.Tensor:
    """[N, blocks, 2] uint8 holding fp16 values -> [N, blocks] float32."""
    return torch.from_numpy(two_bytes.copy().view(np.float16)[..., 0].astype(np.float32))


def _nibbles(packed: np.ndarray) -> torch.Tensor:
    """[N, blocks, 16] nibble bytes -> [N, blocks * 32] codes (byte j: weight j low, weight j + 16 high)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.from_numpy(np.concatenate([low, high], axis=-1).reshape(packed.shape[0], -1).copy())


def _permute_rows(blocks: QuantBlocks, heads: int) -> QuantBlocks:
    """Undo llama.cpp's rotary row interleave of q/k (what transformers does to the float weight)."""
    rows = blocks.codes.shape[0]
    return blocks.rows(torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1))


def gguf_tensor_types(path: str | Path) -> dict[str, str]:
    """{tensor name: ggml type name} of a GGUF file."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


def quantize_like_gguf(model: nn.Module, path: str | Path) -> int:
    """Replace model's linear layers by BlockQuantLinear built from the GGUF at `path`; returns how many.

    Raises ConfigError (one line, what to do) for an architecture or tensor type this cannot map.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = _field_text(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"{path}: --weights gguf maps llama GGUFs only (this one is {arch}); "
                          "use --weights float")
    config = model.config
    layers = model.model.layers
    replaced = 0
    tensors = {t.name: t for t in reader.tensors}
    for name, tensor in tensors.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in LLAMA_LAYER_TENSORS:
            owner, attr = _resolve(layers[int(parts[1])], LLAMA_LAYER_TENSORS[parts[2]])
        else:
            continue
        blocks = decode_blocks(np.asarray(tensor.data), tensor.tensor_type.name)
        if parts[2] == "attn_q":
            blocks = _permute_rows(blocks, config.num_attention_heads)
        elif parts[2] == "attn_k":
            blocks = _permute_rows(blocks, config.num_key_value_heads)
        _replace(owner, attr, blocks, name)
        replaced += 1
    # The output head: its own tensor, or the token embedding when the two are tied.
    head = tensors.get("output.weight") or tensors["token_embd.weight"]
    _replace(model, "lm_head", decode_blocks(np.asarray(head.data), head.tensor_type.name), head.name)
    return replaced + 1


def _field_text(reader, key: str) -> str:
    field = reader.fields.get(key)
    return "" if field is None else bytes(field.parts[field.data[0]]).decode()


def _resolve(module: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, attr = dotted.split(".")
    for part in path:
        module = getattr(module, part)
    return module, attr


def _replace(owner: nn.Module, attr: str, blocks: QuantBlocks, name: str) -> None:
    linear = getattr(owner, attr)
    if getattr(linear, "bias", None) is not None:
        raise ConfigError(f"GGUF tensor {name}: a linear layer with a bias has no block mapping here; "
                          "use --weights float")
    rebuilt = blocks.dequantize()
    if rebuilt.shape != linear.weight.shape or not torch.allclose(rebuilt, linear.weight.float(), rtol=0,
                                                                   atol=LOAD_CHECK_TOLERANCE):
        raise ConfigError(f"GGUF tensor {name}: its blocks do not rebuild the loaded weight; "
                          "use --weights float")
    setattr(owner, attr, BlockQuantLinear(blocks))


def weight_bytes_per_step(model: nn.Module) -> int:
    """Bytes of weights one decoding step reads: every linear layer once (the embedding lookup is a few rows)."""
    total = 0
    for module in model.modules():
        if isinstance(module, BlockQuantLinear):
            total += module.weight_bytes()
        elif isinstance(module, nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


__all__ = ["GROUP", "SUPPORTED_TYPES", "decode_blocks", "gguf_tensor_types", "quantize_like_gguf",
           "weight_bytes_per_step"]
