"""gpu-check's checking code run on CPU, where the op is the C++ CPU twin and the models are tiny: the comparisons
accept a correct op and catch a wrong one, and the model sections produce their rows."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.gpu_check import kernel_checks, model_checks
from dflash_trt.gpu_check.tolerances import cache_error, output_error
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

SMALL = ("small", 8, 2, 64, 1e6, None)


@pytest.fixture(scope="module")
def twin_run():
    from dflash_trt.decoding.kernels.plugin.library import load_library

    load_library()
    inputs = kernel_checks.make_case(SMALL, 3, 600, seed=1, device="cpu")
    ours, ours_in = kernel_checks.kernel(SMALL, inputs)  # CPU tensors: the CPU twin
    ref, ref_in = kernel_checks.reference(SMALL, inputs, chunk=2)
    return inputs, ours, ours_in, ref, ref_in


def test_a_correct_op_passes_every_comparison(twin_run):
    inputs, ours, ours_in, ref, ref_in = twin_run
    assert output_error(ours, ref) is None
    for name in ("cache_k", "cache_v"):
        assert cache_error(name, ours_in[name], ref_in[name], inputs[name], inputs["cache_lens"],
                           inputs["ctx_lens"]) is None


def test_a_wrong_output_or_cache_is_caught(twin_run):
    inputs, ours, ours_in, ref, ref_in = twin_run
    wrong = ours.clone()
    wrong[1, 3, 2, 5] *= 1.05  # one element 5% off
    assert "1 of" in output_error(wrong, ref)
    biased = (ours.float() + 2.0 ** -6 * ours.float().abs().mean()).to(ours.dtype)  # small but systematic
    assert output_error(biased, ref) is not None
    stray = ours_in["cache_v"].clone()
    stray[0, 1, -1, 0] += 1  # a row beyond the appended ones
    assert "outside the appended" in cache_error("cache_v", stray, ref_in["cache_v"], inputs["cache_v"],
                                                 inputs["cache_lens"], inputs["ctx_lens"])
    start = int(inputs["cache_lens"][2])
    off = ours_in["cache_k"].clone()
    off[2, 0, start, :] = -off[2, 0, start, :] + 1  # an appended key written wrong
    assert "appended rows of sequence 2" in cache_error("cache_k", off, ref_in["cache_k"], inputs["cache_k"],
                                                        inputs["cache_lens"], inputs["ctx_lens"])


@pytest.fixture(scope="module")
def tiny_pair():
    from dflash_trt.decoding.model.target import TargetModel

    model = make_tiny_target("qwen3", hidden_size=128, num_layers=6)
    drafter = make_tiny_drafter(model.config, block_size=model_checks.BLOCK, num_layers=2)
    return TargetModel(model), drafter


def test_greedy_section_matches_generate_on_a_tiny_pair(tiny_pair):
    section = model_checks.greedy_equality(*tiny_pair, num_prompts=2, prompt_len=8, new_tokens=12)
    assert section.status == "pass", section.message
    assert [r["identical"] and r["graphed_drafts_equal"] and r["graphed_verify_identical"]
            and r["join_leave_identical"] for r in section.rows] == [True, True]
    assert "up to 2 rows together" in section.message  # the second request joined the first one's batch
    assert all(r["tokens"] == 12 for r in section.rows)


def test_step_times_section_reports_every_batch(tiny_pair):
    section = model_checks.step_times(*tiny_pair, batches=(1, 2), context=24, iterations=1)
    assert [r["batch"] for r in section.rows] == [1, 2]
    for row in section.rows:
        assert min(row["t_AR_ms"], row["t_draft_ms"], row["t_verify16_ms"]) > 0
        assert row["t_draft_graphed_ms"] > 0
        assert min(row["t_AR_graphed_ms"], row["t_verify16_graphed_ms"]) > 0
        assert row["graphed_verify_tokens_equal"] is True  # on CPU: the static path eagerly, twice
        assert row["implied_speedup"] == pytest.approx(
            6.49 * row["t_AR_ms"] / (row["t_draft_ms"] + row["t_verify16_ms"]))
    assert section.status == "pass", section.message
