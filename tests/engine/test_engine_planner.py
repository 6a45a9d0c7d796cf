"""Parallelism planner: divisibility checks and per-GPU figures, checked against hand computation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.planner import GPUS, RUNTIME_RESERVE_BYTES, PlanError, format_plan, plan_parallelism
from dflash_trt.engine.presets import SHIPPED_CONFIGS

FIXTURES = SHIPPED_CONFIGS


def arch(model_id: str) -> TargetArch:
    return TargetArch.from_config(json.loads((FIXTURES / model_id / "config.json").read_text()))


def drafter(model_id: str) -> DrafterConfig:
    return DrafterConfig.from_file(FIXTURES / model_id / "config.json")


@pytest.fixture(scope="module")
def gpt_oss_120b_tp8():
    return plan_parallelism("gpt-oss-120b", arch("openai/gpt-oss-120b"), drafter("z-lab/gpt-oss-120b-DFlash"), tp=8,
                            ep=1, gpu="b200", kv_dtype="fp8", memory_fraction=0.9, dtype="bfloat16", quant="mxfp4",
                            seq_len=8192)


# Hand computation for gpt-oss-120b at TP=8 (config facts: 36 layers, hidden 2880, 64 heads of 64, 8 KV heads,
# 128 experts with intermediate 2880, vocabulary 201088, 18 sliding layers of window 128, bf16 + MXFP4 experts).
H, HD, HEADS, KV, E, I, V, L, TP = 2880, 64, 64, 8, 128, 2880, 201088, 36, 8
BF16 = 2
EMBEDDINGS = 2 * V * H * BF16 / TP  # embedding + untied lm_head, split by vocabulary
ATTENTION = L * (
    (2 * H * HEADS * HD / TP + 2 * H * KV * HD * (1 / KV)) * BF16  # q,o split by heads; one KV head per GPU
    + (HEADS * HD / TP + 2 * KV * HD / KV + H) * BF16  # q,k,v biases split, o bias replicated
    + HEADS / TP * BF16)  # attention sinks
EXPERTS = L * (E * 3 * H * I / TP * (0.5 + 1 / 32)  # 4-bit values + one 8-bit scale per 32
               + E * (2 * I + H) / TP * BF16)  # expert biases
REPLICATED = (2 * L + 1) * H * BF16 + L * (H * E + E) * BF16  # norms + router


def test_gpt_oss_120b_tp8_weights_match_hand_count(gpt_oss_120b_tp8):
    w = gpt_oss_120b_tp8.target_weights
    assert w.embeddings == EMBEDDINGS == 289_566_720
    assert w.attention == pytest.approx(ATTENTION) and round(ATTENTION) == 239_132_736
    assert w.mlp == pytest.approx(EXPERTS) and round(EXPERTS) == 7_624_212_480
    assert w.replicated == REPLICATED == 26_971_776
    assert w.mlp_format == "MXFP4 as shipped"
    # 8 GPUs hold the ~60.8 GiB checkpoint between them
    assert 60 < (w.total - REPLICATED) * TP / 2**30 < 62


def test_gpt_oss_120b_tp8_drafter_weights_match_hand_count(gpt_oss_120b_tp8):
    fc = H * 5 * H  # five target layers concatenated
    per_layer = (H * HEADS * HD + HEADS * HD + 2 * (H * KV * HD + KV * HD) + HEADS * HD * H + H  # attention (+bias)
                 + 3 * H * 7680)  # MLP
    norms = 8 * (2 * HD + 2 * H) + 2 * H
    assert gpt_oss_120b_tp8.drafter_weights == ((fc + 8 * per_layer) / TP + norms) * BF16 == 196_284_288


def test_gpt_oss_120b_tp8_kv_cache_counts_sliding_layers_per_sequence(gpt_oss_120b_tp8):
    plan = gpt_oss_120b_tp8
    per_layer_token = 2 * 1 * HD * 1  # K and V, one KV head per GPU, fp8
    assert plan.kv_per_token == 18 * per_layer_token == 2_304
    assert plan.kv_sliding_per_sequence == 18 * per_layer_token * 128 == 294_912
    assert plan.drafter_kv_per_token == 8 * 2 * 1 * HD * BF16 == 2_048


def test_gpt_oss_120b_tp8_budget_and_tokens_in_flight(gpt_oss_120b_tp8):
    plan = gpt_oss_120b_tp8
    memory = 183_359 * 2**20
    weights = EMBEDDINGS + ATTENTION + EXPERTS + REPLICATED + 196_284_288
    budget = 0.9 * (memory - weights - RUNTIME_RESERVE_BYTES)
    assert plan.gpu.memory_bytes == memory
    assert plan.kv_budget == pytest.approx(budget) and int(budget) == 161_635_240_339
    per_sequence = 8192 * (2_304 + 2_048) + 294_912
    assert plan.max_sequences == int(budget // per_sequence) == 4_496
    assert plan.max_tokens == int(budget * 8192 // per_sequence) == 36_835_743


def test_plan_table_names_every_figure(gpt_oss_120b_tp8):
    table = format_plan(gpt_oss_120b_tp8)
    for text in ("8 x B200", "MXFP4 as shipped", "KV cache / token", "window 128", "drafter weights",
                 "max tokens in flight", "36,835,743", "64 attention heads / TP 8 ok"):
        assert text in table


def test_tp7_for_gpt_oss_120b_fails_with_one_line_listing_valid_sizes():
    with pytest.raises(PlanError) as info:
        plan_parallelism("gpt-oss-120b", arch("openai/gpt-oss-120b"), drafter("z-lab/gpt-oss-120b-DFlash"), tp=7)
    message = str(info.value)
    assert "\n" not in message
    assert "TP=7 does not divide the 64 attention heads" in message
    assert "valid TP for this pair: 1, 2, 4, 8, 16" in message


def test_expert_parallelism_must_divide_the_experts():
    with pytest.raises(PlanError, match="EP=3 does not divide TP=8"):
        plan_parallelism("gpt-oss-120b", arch("openai/gpt-oss-120b"), None, tp=8, ep=3)


def test_expert_parallelism_needs_a_moe_target():
    with pytest.raises(PlanError, match="needs a mixture-of-experts target"):
        plan_parallelism("qwen3-8b", arch("Qwen/Qwen3-8B"), None, tp=2, ep=2)


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    plan = plan_parallelism("qwen3-8b", arch("Qwen/Qwen3-8B"), drafter("z-lab/Qwen3-8B-DFlash-b16"), tp=16)
    assert plan.kv_per_token == 36 * 2 * 1 * 128 * 1  # one of the 8 KV heads per GPU, not half of one
    assert any("(replicated)" in line for line in plan.checks)


def test_a_plan_that_does_not_fit_in_memory_fails_with_one_line():
    huge = dataclasses.replace(arch("Qwen/Qwen3-8B"), num_layers=400)  # ~160 GiB of bf16 weights
    with pytest.raises(PlanError) as info:
        plan_parallelism("huge", huge, None, tp=1, gpu="h200")
    assert "needs" in str(info.value) and "per GPU" in str(info.value) and "\n" not in str(info.value)


def test_fp8_weights_halve_the_dense_mlp_of_a_bf16_target():
    bf16 = plan_parallelism("qwen3-8b", arch("Qwen/Qwen3-8B"), None, tp=1, quant="none")
    fp8 = plan_parallelism("qwen3-8b", arch("Qwen/Qwen3-8B"), None, tp=1, quant="fp8")
    assert fp8.target_weights.mlp == bf16.target_weights.mlp / 2
    assert fp8.target_weights.embeddings == bf16.target_weights.embeddings  # embeddings stay bf16


def test_every_gpu_has_a_capacity_and_a_source_note():
    assert set(GPUS) == {"h100", "h200", "b200", "b300"}
    assert all(spec.memory_bytes > 75 * 2**30 and spec.note for spec in GPUS.values())


def test_plan_command_works_before_any_download(tmp_path, monkeypatch, capsys):
    from dflash_trt.cli import main

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: nothing downloaded
    assert main(["plan", "--model", "gpt-oss-120b", "--tp", "8", "--gpu", "b200"]) == 0
    out = capsys.readouterr().out
    assert "planning from its published config.json" in out
    assert "8,179,883,712" in out  # target weights per GPU, as counted by hand above
    assert main(["plan", "--model", "gpt-oss-120b", "--tp", "7"]) == 2
    assert "TP=7 does not divide the 64 attention heads" in capsys.readouterr().err
