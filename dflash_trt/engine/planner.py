"""Parallelism plan: divisibility checks and a per-GPU memory budget for a target/drafter pair.

KV-cache accounting: full-attention layers store every token of a sequence; sliding-window layers
(gpt-oss: every other layer, window 128) store at most `window` tokens per sequence, so their cost is
per sequence, not per token. The drafter keeps its own per-layer cache of context K/V (model dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.weights import (DTYPE_BYTES, WeightBytes, drafter_weight_bytes, kv_bytes_per_layer_token,
                                       target_weight_bytes)
from dflash_trt.errors import DFlashError

MIB = 1 << 20
GIB = 1 << 30
KV_BYTES = {"fp8": 1, "bf16": 2}
# Assumed per-GPU memory outside weights and KV: CUDA context, NCCL buffers, activations, CUDA graphs.
RUNTIME_RESERVE_BYTES = 4 * GIB


class PlanError(DFlashError):
    """A parallel layout the model cannot be split into, or one that does not fit in memory."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    note: str
    bandwidth: float  # bytes/s of HBM, the datasheet figure


# Total memory as the driver reports it (nvidia-smi), which is a little below the marketing figure; memory
# bandwidth as NVIDIA's datasheets give it (SXM parts).
GPUS = {
    "h100": GpuSpec("H100", 81_559 * MIB, "nvidia-smi total of an H100 SXM (80 GB class)", 3.35e12),
    "h200": GpuSpec("H200", 143_771 * MIB, "nvidia-smi total of an H200 SXM (141 GB class)", 4.8e12),
    "b200": GpuSpec("B200", 183_359 * MIB, "nvidia-smi total of a B200 (192 GB class)", 8e12),
    "b300": GpuSpec("B300", 275 * 10**9, "approximate: instances report about 275 GB of the 288 GB", 8e12),
}


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: GpuSpec
    tp: int
    ep: int
    kv_dtype: str
    memory_fraction: float
    seq_len: int
    checks: tuple[str, ...]
    target_weights: WeightBytes
    drafter_weights: float
    reserve: int
    kv_budget: float  # bytes for the KV caches at memory_fraction
    kv_per_token: int  # target, full-attention layers, per token of context
    kv_sliding_per_sequence: int  # target, sliding-window layers, at most `window` tokens per sequence
    drafter_kv_per_token: int
    num_full_layers: int
    num_sliding_layers: int
    sliding_window: int | None
    step_bytes: float = 0.0  # weights one target forward reads at batch 1, per GPU
    draft_bytes: float = 0.0  # weights one draft reads (the drafter's and the lm_head again), per GPU

    @property
    def step_floor_s(self) -> float:
        """The memory-bandwidth floor of a verify step (target forward + draft) at batch 1: no step is faster."""
        return (self.step_bytes + self.draft_bytes) / self.gpu.bandwidth

    @property
    def per_sequence_bytes(self) -> int:
        return self.seq_len * (self.kv_per_token + self.drafter_kv_per_token) + self.kv_sliding_per_sequence

    @property
    def max_sequences(self) -> int:
        return int(self.kv_budget // self.per_sequence_bytes)

    @property
    def max_tokens(self) -> int:
        """Tokens of context the KV budget holds when sequences are seq_len long."""
        return int(self.kv_budget * self.seq_len // self.per_sequence_bytes)


def divisibility_problems(arch: TargetArch, drafter: DrafterConfig | None, tp: int, ep: int) -> list[str]:
    problems = []
    if arch.num_attention_heads % tp:
        problems.append(f"TP={tp} does not divide the {arch.num_attention_heads} attention heads")
    if arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        problems.append(f"TP={tp} neither divides nor is a multiple of the {arch.num_kv_heads} KV heads")
    if arch.vocab_size % tp:
        problems.append(f"TP={tp} does not divide the vocabulary of {arch.vocab_size}")
    if tp % ep:
        problems.append(f"EP={ep} does not divide TP={tp}")
    if arch.is_moe:
        if arch.num_experts % ep:
            problems.append(f"EP={ep} does not divide the {arch.num_experts} experts")
        moe_tp = max(1, tp // ep)
        if arch.intermediate_size % moe_tp:
            problems.append(f"MoE TP={moe_tp} does not divide the expert intermediate size {arch.intermediate_size}")
    elif ep > 1:
        problems.append(f"EP={ep} needs a mixture-of-experts target")
    if drafter is not None and drafter.num_attention_heads % tp:
        problems.append(f"TP={tp} does not divide the drafter's {drafter.num_attention_heads} attention heads")
    return problems


def valid_tp(arch: TargetArch, drafter: DrafterConfig | None, limit: int = 64) -> list[int]:
    return [t for t in range(1, limit + 1) if not divisibility_problems(arch, drafter, t, 1)]


def plan_parallelism(model: str, arch: TargetArch, drafter: DrafterConfig | None, tp: int, ep: int = 1,
                     gpu: str = "h200", kv_dtype: str = "fp8", memory_fraction: float = 0.9,
                     dtype: str = "bfloat16", quant: str = "none", seq_len: int = 8192) -> Plan:
    """Check the layout and budget one GPU's memory. Raises PlanError with one line when impossible."""
    problems = divisibility_problems(arch, drafter, tp, ep)
    if problems:
        valid = ", ".join(str(t) for t in valid_tp(arch, drafter))
        raise PlanError(f"{model}: {problems[0]} (valid TP for this pair: {valid})")
    if gpu not in GPUS:
        raise PlanError(f"unknown GPU '{gpu}' (known: {', '.join(GPUS)})")
    if not 0 < memory_fraction <= 1:
        raise PlanError(f"memory fraction must be in (0, 1], got {memory_fraction}")
    spec = GPUS[gpu]
    weights = target_weight_bytes(arch, tp, dtype, quant)
    drafter_weights = drafter_weight_bytes(drafter, tp, dtype) if drafter is not None else 0.0
    free = spec.memory_bytes - weights.total - drafter_weights - RUNTIME_RESERVE_BYTES
    if free <= 0:
        need = (weights.total + drafter_weights + RUNTIME_RESERVE_BYTES) / GIB
        raise PlanError(f"{model}: TP={tp} needs {need:.1f} GiB per GPU before any KV cache, more than the "
                        f"{spec.memory_bytes / GIB:.1f} GiB of a {spec.name}; use a larger TP or a smaller quantization")
    per_layer = kv_bytes_per_layer_token(arch.num_kv_heads, arch.head_dim, tp, KV_BYTES[kv_dtype])
    window = arch.sliding_window if arch.num_sliding_layers else None
    drafter_kv = 0
    if drafter is not None:
        drafter_kv = drafter.num_hidden_layers * kv_bytes_per_layer_token(
            drafter.num_key_value_heads, drafter.head_dim, tp, DTYPE_BYTES[dtype])
    active = arch.experts_per_token / arch.num_experts if arch.is_moe else 1.0
    step_bytes = weights.read_per_step(arch.tie_word_embeddings, active)
    head_bytes = weights.embeddings if arch.tie_word_embeddings else weights.embeddings / 2
    return Plan(
        step_bytes=step_bytes, draft_bytes=drafter_weights + head_bytes,
        model=model, gpu=spec, tp=tp, ep=ep, kv_dtype=kv_dtype, memory_fraction=memory_fraction, seq_len=seq_len,
        checks=_check_lines(arch, drafter, tp, ep),
        target_weights=weights, drafter_weights=drafter_weights, reserve=RUNTIME_RESERVE_BYTES,
        kv_budget=memory_fraction * free,
        kv_per_token=arch.num_full_layers * per_layer,
        kv_sliding_per_sequence=arch.num_sliding_layers * per_layer * min(window or 0, seq_len),
        drafter_kv_per_token=drafter_kv,
        num_full_layers=arch.num_full_layers, num_sliding_layers=arch.num_sliding_layers, sliding_window=window,
    )


def _check_lines(arch: TargetArch, drafter: DrafterConfig | None, tp: int, ep: int) -> tuple[str, ...]:
    kv = f"{arch.num_kv_heads} KV heads / TP {tp}" + (" (replicated)" if tp > arch.num_kv_heads else "")
    lines = [f"{arch.num_attention_heads} attention heads / TP {tp}", kv, f"vocabulary {arch.vocab_size} / TP {tp}"]
    if arch.is_moe:
        lines.append(f"{arch.num_experts} experts / EP {ep} (MoE TP {tp // ep})")
    if drafter is not None:
        lines.append(f"drafter {drafter.num_attention_heads} heads / TP {tp}")
    return tuple(lines)


def format_plan(plan: Plan) -> str:
    """The plan as a small table (bytes and GiB per GPU)."""
    w = plan.target_weights
    window = (f"{plan.num_sliding_layers} sliding layers x window {plan.sliding_window}, per sequence"
              if plan.num_sliding_layers else "no sliding-window layers")
    rows = [
        ("GPU memory", plan.gpu.memory_bytes),
        ("target weights", w.total),
        ("  embedding + lm_head", w.embeddings),
        ("  attention", w.attention),
        (f"  MLP / experts ({w.mlp_format})", w.mlp),
        ("  norms + router (replicated)", w.replicated),
        ("drafter weights", plan.drafter_weights),
        ("runtime reserve (assumed)", plan.reserve),
        (f"free for KV cache at {plan.memory_fraction:g}", plan.kv_budget),
        (f"KV cache / token ({plan.num_full_layers} full-attention layers, {plan.kv_dtype})", plan.kv_per_token),
        (f"KV cache ({window})", plan.kv_sliding_per_sequence),
        ("drafter context cache / token", plan.drafter_kv_per_token),
    ]
    head = (f"plan: {plan.model} on {plan.tp} x {plan.gpu.name} (TP={plan.tp}, EP={plan.ep}), KV cache "
            f"{plan.kv_dtype}, memory fraction {plan.memory_fraction:g}")
    lines = [head, "  checks: " + "; ".join(f"{c} ok" for c in plan.checks),
             f"  {'per GPU':<62} {'bytes':>16} {'GiB':>9}"]
    lines += [f"  {name:<62} {int(round(value)):>16,} {value / GIB:>9.2f}" for name, value in rows]
    lines.append(f"  {'max tokens in flight (sequences of ' + str(plan.seq_len) + ')':<62} {plan.max_tokens:>16,}")
    lines.append(f"  {'max sequences in flight (of ' + str(plan.seq_len) + ' tokens)':<62} {plan.max_sequences:>16,}")
    lines.append(f"  GPU memory: {plan.gpu.note}")
    if plan.step_bytes:
        # Decoding at small batch is bound by the bytes each step reads; DFlash spreads a step over tau tokens.
        per_token = plan.step_bytes + plan.draft_bytes
        lines += [f"  weights read per step, batch 1: target {plan.step_bytes / GIB:.2f} GiB + draft "
                  f"{plan.draft_bytes / GIB:.2f} GiB per GPU (MoE: the active experts only)",
                  f"  bandwidth floor at {plan.gpu.bandwidth / 1e12:g} TB/s: {plan.step_floor_s * 1e6:.0f} us per DFlash "
                  f"step, so at most {1 / plan.step_floor_s:,.0f} steps/s; tokens/s <= steps/s x tau, "
                  f"{per_token / 1e6:.0f} MB / tau per token (plain decoding: {plan.step_bytes / 1e6:.0f} MB per "
                  f"token, <= {plan.gpu.bandwidth / plan.step_bytes:,.0f} tokens/s)"]
    return "\n".join(lines)

