"""Tiny random targets and drafters for tests and examples (CPU, seconds to build).

Drafters are written in the published DFlash format, so the same loader as for real checkpoints is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dflash_trt.decoding.model.config import FAMILY_ARCHITECTURE, DrafterConfig, default_target_layer_ids
from dflash_trt.decoding.model.drafters import DrafterBase, build_drafter, save_drafter

TARGET_ARCHS = ("llama", "qwen3", "gpt_oss")


def tiny_target_config(arch: str, vocab_size: int = 256, num_layers: int = 6, hidden_size: int = 64, **overrides):
    """A small Hugging Face config of the given architecture."""
    from transformers import GptOssConfig, LlamaConfig, Qwen3Config

    common: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=hidden_size // 4, max_position_embeddings=2048,
                                  tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
                                  pad_token_id=None)
    if arch == "llama":
        config = LlamaConfig(**common)
    elif arch == "qwen3":
        config = Qwen3Config(**common)
    elif arch == "gpt_oss":
        # Sliding window of 8 on alternate layers so that short tests cross the window.
        config = GptOssConfig(**common, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                              layer_types=["sliding_attention", "full_attention"] * (num_layers // 2),
                              rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "truncate": False,
                                               "original_max_position_embeddings": 256, "rope_theta": 150000.0})
    else:
        raise ValueError(f"unknown arch {arch!r}; choose from {TARGET_ARCHS}")
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def make_tiny_target(arch: str, directory: str | Path | None = None, seed: int = 0, logit_scale: float = 8.0,
                     **config_kwargs):
    """A random-weight causal LM (saved to `directory` when given). Returns the HF model.

    logit_scale multiplies the output head: random init gives near-uniform logits, and a larger scale makes
    greedy choices well separated, so equality tests compare decisions rather than float noise.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_target_config(arch, **config_kwargs), dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.eval()
    if directory is not None:
        model.save_pretrained(str(directory))
    return model


def tiny_drafter_config(target_config, block_size: int = 8, num_layers: int = 2, mask_token_id: int | None = None,
                        attention_bias: bool = False, rope_scaling: dict | None = None,
                        target_layer_ids: list[int] | None = None, family: str = "dflash",
                        sliding_window: int | None = None, is_causal: bool | None = None,
                        **dflash_settings) -> DrafterConfig:
    """Drafter config matching `target_config` (hidden size, vocabulary, layer count).

    family "dflash2" adds the DFlash2 fields (2 taps, groups of 16 channels, rank 8, top-8 unless given in
    dflash_settings); sliding_window makes every layer a sliding one; dflash_settings go to dflash_config
    (output_multiplier, final_logit_softcapping, ...).
    """
    num_target_layers = target_config.num_hidden_layers
    dflash = {
        "target_layer_ids": target_layer_ids or default_target_layer_ids(num_target_layers, min(num_layers, 3)),
        "mask_token_id": target_config.vocab_size - 1 if mask_token_id is None else mask_token_id,
    }
    if family == "dflash2":
        dflash.update(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=8)
    dflash.update(dflash_settings)
    data = {
        "architectures": [FAMILY_ARCHITECTURE[family]],
        "model_type": "qwen3",
        "hidden_size": target_config.hidden_size,
        "intermediate_size": 2 * target_config.hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": target_config.hidden_size // 4,
        "vocab_size": target_config.vocab_size,
        "block_size": block_size,
        "num_target_layers": num_target_layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": rope_scaling,
        "attention_bias": attention_bias,
        "max_position_embeddings": 2048,
        "dflash_config": dflash,
    }
    if sliding_window is not None:
        data.update(layer_types=["sliding_attention"] * num_layers, sliding_window=sliding_window,
                    use_sliding_window=True)
    if is_causal is not None:
        data["is_causal"] = is_causal
    return DrafterConfig.from_dict(data)


def make_tiny_drafter(target_config, directory: str | Path | None = None, seed: int = 0,
                      **config_kwargs) -> DrafterBase:
    """A random-weight drafter for `target_config` (saved in the published format when directory is given).

    DFlash2 drafters get random convolutions and codebooks too, so both modules change the drafts.
    """
    torch.manual_seed(seed)
    drafter = build_drafter(tiny_drafter_config(target_config, **config_kwargs))
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0, 0.1)
            elif name.endswith("base_kernel"):
                param.normal_(0, 0.3)
                param[:, 0] += 1.0
            elif name.endswith("kernel_projection.weight"):
                param.normal_(0, 0.05)
            elif name.endswith("codebook"):
                param.normal_(0, 1.0)
    drafter.eval()
    if directory is not None:
        save_drafter(drafter, directory)
    return drafter


def quantize_like_q4_1(model) -> int:
    """Replace every bias-free linear layer of a tiny model by Q4_1 blocks (its output head by Q8_0), quantized by
    ggml's own quantizer (the `gguf` package), as a GGUF target at its precision has them; returns how many."""
    import gguf
    from gguf import quants

    from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear
    from dflash_trt.decoding.model.gguf_weights import decode_blocks

    count = 0
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if isinstance(child, torch.nn.Linear) and child.bias is None:
                kind = "Q8_0" if child is model.get_output_embeddings() else "Q4_1"
                raw = quants.quantize(child.weight.detach().numpy(), gguf.GGMLQuantizationType[kind])
                setattr(owner, name, BlockQuantLinear(decode_blocks(raw, kind)))
                count += 1
    return count


def tiny_gguf_target(seed: int = 0):
    """A tiny Llama TargetModel as the demo target runs at its GGUF precision: Q4_1 blocks (quantize_like_q4_1), the
    batch-invariant attention and the native decoder forward (model/lean_llama.py)."""
    from dflash_trt.decoding.model.target import TargetModel

    model = make_tiny_target("llama", seed=seed)
    quantize_like_q4_1(model)
    target = TargetModel(model)
    target.use_rowwise_attention()
    reason = target.use_lean_forward()
    if reason:
        raise RuntimeError(f"the native decoder does not apply to the tiny GGUF target: {reason}")
    return target
