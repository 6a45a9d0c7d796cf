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


def test_tree_section_times_every_budget_and_its_spine_matches_the_chain(tiny_pair):
    from dflash_trt.gpu_check import tree_times

    section = tree_times.tree_verify_times(*tiny_pair, batches=(1, 2), context=24, budgets=(16, 40), iterations=1)
    assert section.status == "pass", section.message
    assert [(r["batch"], r["nodes"]) for r in section.rows] == [(1, 16), (1, 40), (2, 16), (2, 40)]
    for row in section.rows:
        assert row["spine_agreement"] == 1.0  # fp32 on CPU: exact
        assert min(row["t_verify_tree_ms"], row["t_verify16_chain_ms"], row["t_draft_topk_ms"]) > 0
        assert row["implied_speedup_tree"] == pytest.approx(
            10.73 * row["t_AR_ms"] / (row["t_draft_topk_ms"] + row["t_verify_tree_ms"]))


def test_tree_shape_is_a_spine_with_siblings_and_a_wrong_mask_is_caught(tiny_pair, monkeypatch):
    from dflash_trt.gpu_check import tree_times

    parents, depths = tree_times.tree_shape(20, 15)
    assert depths[:15] == list(range(1, 16)) and parents[:15] == list(range(-1, 14))
    assert len(parents) == 20 and all(p < i for i, p in enumerate(parents))
    assert all(depths[i] == (depths[p] if p >= 0 else 0) + 1 for i, p in enumerate(parents))
    mask = tree_times.ancestor_mask([-1, 0, -1])  # root, a, a's child, a's sibling
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False],
                             [True, True, True, False], [True, False, False, True]]
    # Broken on purpose: every node sees every other node (no ancestor mask): the spine no longer matches
    monkeypatch.setattr(tree_times, "ancestor_mask", lambda parents: torch.ones(len(parents) + 1, len(parents) + 1,
                                                                               dtype=torch.bool))
    section = tree_times.tree_verify_times(*tiny_pair, batches=(1,), context=24, budgets=(40,), iterations=1)
    assert section.status == "fail" and "mask or positions wrong" in section.message
    # ... also when the spine is checked on a pair of its own (what gpu-check does: a shallow fp32 pair)
    section = tree_times.tree_verify_times(*tiny_pair, batches=(1,), context=24, budgets=(40,), iterations=1,
                                           spine_pair=tiny_pair)
    assert section.status == "fail" and "mask or positions wrong" in section.message
