"""The `onnx` runtime (exported drafter + onnxruntime + the plugin custom op) drafts like the torch drafter.

Both families: DFlash, and DFlash2 (convolutions in the graph, the candidate selector on the host, whose
candidates and q must match too). Both custom-op providers are checked: the C++ library (where onnxruntime's C header was found) and the
onnxruntime-extensions Python op running the same CPU twin (everywhere else).
Stated tolerance: final hidden states within 1e-5 (DFlash) or 3e-5 (DFlash2: four more random convolutions
per layer around the same sums) and logits within 1e-4 (max abs, fp32) of the PyTorch drafter; draft tokens,
candidates and generated tokens identical.
"""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.kernels.plugin.onnx_node import ort_library
from dflash_trt.decoding.model.drafters import Proposal
from dflash_trt.decoding.model.target import load_target
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


# DFlash2 with a kernel longer than the shortest block (2 slots), so the padded convolution is exercised.
FAMILIES = {"dflash": {}, "dflash2": {"family": "dflash2", "conv_kernel_size": 3}}
HIDDEN_TOLERANCE = {"dflash": 1e-5, "dflash2": 3e-5}


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    from dflash_trt.decoding.model.exported.export import export_drafter

    torch.set_num_threads(1)
    target_dir, drafter_dir = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("drafter")
    target_model = make_tiny_target("qwen3", target_dir, hidden_size=256)  # head_dim 64
    drafter = make_tiny_drafter(target_model.config, drafter_dir, block_size=6, num_layers=2,
                                **FAMILIES[request.param])
    onnx_path = export_drafter(drafter, tmp_path_factory.mktemp("onnx") / "drafter.onnx")
    return target_dir, drafter_dir, load_target(target_dir), drafter, onnx_path


@pytest.fixture(scope="module", params=["library", "python"])
def onnx_drafter(request, pair):
    """The exported drafter in onnxruntime, with the C++ custom-op library or the Python-op fallback."""
    from dflash_trt.decoding.kernels.plugin import ort_python_op
    from dflash_trt.decoding.model.exported.head import load_draft_head
    from dflash_trt.decoding.model.exported.onnx import OnnxDrafter

    if request.param == "library" and ort_library() is None:
        pytest.skip("C++ custom-op library not built (onnxruntime_c_api.h not found; set ONNXRUNTIME_ROOT)")
    if request.param == "python" and not ort_python_op.available():
        pytest.skip("onnxruntime-extensions is not installed")
    return OnnxDrafter(pair[4], load_draft_head(pair[1]), provider=request.param)


def as_proposal(result) -> Proposal:
    return result if isinstance(result, Proposal) else Proposal(result)


def assert_same_drafts(expected, got, slots=None):
    """Drafts equal; for a selector's proposal, candidates equal and q within 1e-5 (over the first `slots`)."""
    expected, got = as_proposal(expected), as_proposal(got)
    cut = slice(None, slots)
    assert torch.equal(expected.drafts[..., cut], got.drafts[..., cut])
    assert (expected.q is None) == (got.q is None)
    if expected.q is not None:
        assert torch.equal(expected.candidates[..., cut, :], got.candidates[..., cut, :])
        torch.testing.assert_close(expected.q[..., cut, :], got.q[..., cut, :], rtol=0, atol=1e-5)


def test_hidden_states_and_logits_match_torch_drafter(pair, onnx_drafter):
    _, _, target, drafter, _ = pair
    torch.manual_seed(0)
    k = drafter.config.num_target_features
    torch_cache, onnx_cache = drafter.new_cache(2, 64), onnx_drafter.new_cache(2, 64)
    for step, ctx_lens in enumerate(([7, 3], [2, 1], [5, 4])):
        block = torch.randint(0, 255, (2, 6))
        features = torch.randn(2, max(ctx_lens), k * 256)
        lens = torch.tensor(ctx_lens)
        with torch.inference_mode():
            expected = drafter(target.embed(block), features, lens, torch_cache)
            got = onnx_drafter(target.embed(block), features, lens, onnx_cache)
            logit_err = (target.lm_head(expected) - target.lm_head(got)).abs().max().item()
        tolerance = HIDDEN_TOLERANCE[drafter.config.family]
        assert (expected - got).abs().max().item() <= tolerance, f"step {step}"
        assert logit_err <= 1e-4, f"step {step}: logits differ by {logit_err:.3g}"
        assert torch.equal(onnx_cache.lens, torch_cache.lens)


def test_proposes_the_same_draft_tokens_as_torch(pair, onnx_drafter):
    _, _, target, drafter, _ = pair
    torch.manual_seed(1)
    torch_cache, onnx_cache = drafter.new_cache(3, 48), onnx_drafter.new_cache(3, 48)
    for _ in range(4):
        block = torch.randint(0, 255, (3, 6))
        features = torch.randn(3, 4, drafter.config.num_target_features * 256)
        lens = torch.tensor([4, 2, 3])
        assert_same_drafts(drafter.propose(target, block, features, lens, torch_cache),
                           onnx_drafter.propose(target, block, features, lens, onnx_cache))


def test_shortened_blocks_of_a_ragged_batch_draft_as_torch(pair, onnx_drafter):
    """The last block of a generation shrinks; rows of one batch can have different block lengths."""
    _, _, target, drafter, _ = pair
    torch.manual_seed(2)
    torch_cache, onnx_cache = drafter.new_cache(3, 48), onnx_drafter.new_cache(3, 48)
    for block_lens in ([6, 6, 6], [6, 3, 2], [4, 2, 4]):
        block = torch.randint(0, 255, (3, 6))
        features = torch.randn(3, 4, drafter.config.num_target_features * 256)
        lens, block_lens = torch.tensor([4, 2, 3]), torch.tensor(block_lens)
        expected = drafter.propose(target, block, features, lens, torch_cache, block_lens=block_lens)
        got = onnx_drafter.propose(target, block, features, lens, onnx_cache, block_lens=block_lens)
        expected, got = as_proposal(expected), as_proposal(got)
        for row, length in enumerate(block_lens.tolist()):
            assert_same_drafts(expected.drafts[row], got.drafts[row], length - 1)
            if expected.q is not None:
                assert_same_drafts(Proposal(expected.drafts[row], expected.candidates[row], expected.q[row]),
                                   Proposal(got.drafts[row], got.candidates[row], got.q[row]), length - 1)
        assert torch.equal(onnx_cache.lens, torch_cache.lens)


def test_generate_with_onnx_runtime_is_token_identical_to_torch(pair, onnx_drafter):
    _, _, target, drafter, _ = pair
    prompts = [[5, 17, 33, 2, 90], [7, 8]]
    params = [SamplingParams(max_new_tokens=24), SamplingParams(max_new_tokens=21)]  # ragged last blocks
    expected = generate(target, drafter, prompts, params)
    got = generate(target, onnx_drafter, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in expected]


def test_sampled_generate_with_onnx_runtime_is_token_identical_to_torch(pair, onnx_drafter):
    """At T > 0 a DFlash2 draft is drawn from the selector on the host: same generator, same draws."""
    _, _, target, drafter, _ = pair
    prompts = [[5, 17, 33, 2, 90], [7, 8]]
    params = [SamplingParams(max_new_tokens=22, temperature=0.9, seed=3),
              SamplingParams(max_new_tokens=19, temperature=0.7, seed=4)]
    expected = generate(target, drafter, prompts, params)
    got = generate(target, onnx_drafter, prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in expected]


def assert_same_ranking(ids, logprobs, expected_ids, expected_logprobs):
    """The same log-probs best first (within 1e-4), and the same ids wherever a rank is not a near tie (1e-3): the
    graph's states differ from torch's by up to 3e-5, which may swap exactly tied candidates of a tiny drafter."""
    logprobs, expected_logprobs = torch.tensor(logprobs), torch.tensor(expected_logprobs)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-4)
    gaps = (expected_logprobs[:, None] - expected_logprobs[None, :]).abs() + torch.eye(len(expected_logprobs))
    clear = (gaps > 1e-3).all(dim=1)
    assert clear[0] or len(clear) == 1
    assert [i for i, c in zip(ids, clear) if c] == [i for i, c in zip(expected_ids, clear) if c]


def test_the_onnx_drafters_candidates_equal_the_torch_drafters(pair, onnx_drafter):
    """A tree's per-slot top-K (DFlash: ids and log-probs; DFlash2: the lattice) from a ragged batch."""
    _, _, target, drafter, _ = pair
    torch.manual_seed(3)
    torch_cache, onnx_cache = drafter.new_cache(3, 48), onnx_drafter.new_cache(3, 48)
    block = torch.randint(0, 255, (3, 6))
    features = torch.randn(3, 4, drafter.config.num_target_features * 256)
    lens, block_lens = torch.tensor([4, 2, 3]), torch.tensor([6, 3, 6])
    expected = drafter.propose(target, block, features, lens, torch_cache, block_lens=block_lens, top_k=4)
    got = onnx_drafter.propose(target, block, features, lens, onnx_cache, block_lens=block_lens, top_k=4)
    checked = 0
    for row, length in enumerate(block_lens.tolist()):
        for slot in range(length - 1):
            if expected.children is None:
                assert_same_ranking(got.topk_ids[row, slot].tolist(), got.topk_logprobs[row, slot].tolist(),
                                    expected.topk_ids[row, slot].tolist(), expected.topk_logprobs[row, slot].tolist())
                checked += 1
                continue
            if not torch.equal(got.candidates[row, slot], expected.candidates[row, slot]):
                continue  # a near tie at the selector's K-th candidate: its lattice normalises over other tokens
            for parent in (int(block[row, 0]), int(expected.drafts[row, slot])):
                with torch.inference_mode():  # as a step ranks them
                    assert_same_ranking(*got.children(row, slot, parent), *expected.children(row, slot, parent))
                checked += 1
    assert checked >= 10


def test_a_tree_with_the_onnx_drafter_gives_plain_tokens_and_the_torch_drafters_tree(pair, onnx_drafter):
    from dflash_trt.decoding.step.verify import TreeVerify

    _, _, target, drafter, _ = pair
    prompts = [[5, 17, 33, 2, 90], [7, 8]]
    params = [SamplingParams(max_new_tokens=24), SamplingParams(max_new_tokens=21)]  # ragged last blocks
    plain = generate(target, None, prompts, params, block_size=1)
    expected = generate(target, drafter, prompts, params, method=TreeVerify(12, 3))
    got = generate(target, onnx_drafter, prompts, params, method=TreeVerify(12, 3))
    assert [r.token_ids for r in got] == [r.token_ids for r in plain] == [r.token_ids for r in expected]
    assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in expected]


@pytest.mark.slow
def test_cli_generate_with_onnx_runtime_matches_torch(pair, capsys):
    from dflash_trt.cli import main

    target_dir, drafter_dir = pair[0], pair[1]
    outputs = {}
    for runtime in ("torch", "onnx"):
        argv = ["generate", "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompt-ids",
                "3,14,15,92", "--max-new-tokens", "20", "--runtime", runtime, "--json"]
        assert main(argv) == 0
        outputs[runtime] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert outputs["onnx"]["token_ids"] == outputs["torch"]["token_ids"]
