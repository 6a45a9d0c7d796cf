"""Bytes of weights per GPU, counted from the config the way the checkpoint ships them.

Sharding model (TensorRT-LLM's tensor parallelism): attention splits by heads (KV heads are replicated
when TP exceeds them), MLPs and experts split by TP (EP only changes how the same expert bytes are
split), the embedding and lm_head split by vocabulary; norms and the MoE router are replicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import TargetArch

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Bytes per weight value of a quantized linear layer.
MXFP4_BYTES = 0.5 + 1 / 32  # 4-bit E2M1 values + one 8-bit (E8M0) scale per block of 32
NVFP4_BYTES = 0.5 + 1 / 16  # 4-bit E2M1 values + one FP8 (E4M3) scale per block of 16
FP8_BYTES = 1.0


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads each GPU holds: split when TP divides them, else replicated up to one per GPU."""
    return max(1, math.ceil(num_kv_heads / tp))


def linear_bytes_per_value(quant: str, dtype_bytes: float) -> float:
    """Bytes per value of a linear layer quantized by ModelOpt (mxfp4 only ever means 'experts as shipped')."""
    return {"fp8": FP8_BYTES, "nvfp4": NVFP4_BYTES}.get(quant, dtype_bytes)


@dataclass(frozen=True)
class WeightBytes:
    embeddings: float  # embedding + lm_head, per GPU
    attention: float
    mlp: float  # dense MLP or routed experts (with their biases)
    replicated: float  # norms and router, on every GPU
    mlp_format: str = ""  # how MLP/expert weights are stored, e.g. "MXFP4 as shipped"

    @property
    def total(self) -> float:
        return self.embeddings + self.attention + self.mlp + self.replicated

    def read_per_step(self, tied_embeddings: bool, active_expert_share: float = 1.0) -> float:
        """Bytes one decoding step reads at batch 1: the lm_head (the embedding lookup reads a few rows), attention,
        the MLP (of a MoE, only the active experts' share) and the replicated weights."""
        head = self.embeddings if tied_embeddings else self.embeddings / 2
        return head + self.attention + self.mlp * active_expert_share + self.replicated


def target_weight_bytes(arch: TargetArch, tp: int, dtype: str, quant: str) -> WeightBytes:
    """Weight bytes on one GPU of a TP group. gpt-oss experts count as shipped (MXFP4) unless requantized."""
    b = DTYPE_BYTES[dtype]
    h, hd, heads, kv = arch.hidden_size, arch.head_dim, arch.num_attention_heads, arch.num_kv_heads
    shipped_mxfp4 = arch.quant_method == "mxfp4" and quant in ("none", "mxfp4")
    linear = linear_bytes_per_value(quant, b)

    vocab_rows = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2)
    embeddings = vocab_rows * b / tp

    kv_share = kv_heads_per_gpu(kv, tp) / kv  # fraction of the K/V projections on one GPU
    q_o = 2 * h * heads * hd
    k_v = 2 * h * kv * hd
    attention = (q_o / tp + k_v * kv_share) * linear
    if arch.attention_bias:
        attention += (heads * hd / tp + 2 * kv * hd * kv_share + h) * b
    if arch.model_type == "gpt_oss":
        attention += heads / tp * b  # one attention-sink logit per head
    attention *= arch.num_layers

    mlp_format = "MXFP4 as shipped" if shipped_mxfp4 else (quant if quant != "none" else dtype)
    if arch.is_moe:
        values = arch.num_experts * 3 * h * arch.intermediate_size
        mlp = values / tp * (MXFP4_BYTES if shipped_mxfp4 else linear)
        if arch.model_type == "gpt_oss":  # experts carry biases on gate_up and down
            mlp += arch.num_experts * (2 * arch.intermediate_size + h) / tp * b
        router = (h * arch.num_experts + arch.num_experts) * b
    else:
        mlp = 3 * h * arch.intermediate_size / tp * linear
        router = 0.0
    mlp *= arch.num_layers

    norms = (2 * arch.num_layers + 1) * h * b
    if arch.model_type == "qwen3":
        norms += 2 * hd * arch.num_layers * b  # q_norm, k_norm
    replicated = norms + router * arch.num_layers
    return WeightBytes(embeddings, attention, mlp, replicated, mlp_format)


def drafter_weight_bytes(config: DrafterConfig, tp: int, dtype: str) -> float:
    """Drafter weights on one GPU (sharded like the target; norms replicated)."""
    from dflash_trt.decoding.model.drafters import expected_shapes

    total = norms = 0
    for name, shape in expected_shapes(config).items():
        count = math.prod(shape)
        total += count
        if len(shape) == 1 and "norm" in name:
            norms += count
    return ((total - norms) / tp + norms) * DTYPE_BYTES[dtype]


def kv_bytes_per_layer_token(num_kv_heads: int, head_dim: int, tp: int, kv_bytes: int) -> int:
    """K and V of one token in one layer, on one GPU."""
    return 2 * kv_heads_per_gpu(num_kv_heads, tp) * head_dim * kv_bytes
