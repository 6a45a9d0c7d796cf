"""The C++ CPU twin computes dflash_trt.decoding.kernels.attention.draft_attention: output and cache update.

Tolerances (max abs error against the PyTorch reference, inputs ~ N(0, 1)): fp32 1e-5; bf16 2 ulp of the
output's magnitude (2 * 2**-8 * max|out|); fp16 2 ulp (2 * 2**-11 * max|out|). The 16-bit bounds cover the
order in which fp32 sums are rounded once to the output type.
The cache holds RoPE'd keys: there the bound adds one fp32 ulp of the largest rotation angle times |k|, because
torch's vectorised pow may put an inverse frequency one ulp away from the correctly rounded one the plugin uses
(tests/plugin/test_plugin_rope_table.py); with the plugin's own table the cache agrees to 1e-5.
"""

from __future__ import annotations

import random

import pytest
import torch
from numpy_reference import draft_attention as numpy_draft_attention
from plugin_cases import GPT_OSS_YARN, Case, clone_inputs, make_inputs, random_case

from dflash_trt.decoding.kernels.attention import draft_attention
from dflash_trt.decoding.kernels.plugin.library import cpu_draft_attention, rope_table
from dflash_trt.decoding.kernels.rope import RotaryEmbedding

TOLERANCE_ULPS = {torch.bfloat16: 2 * 2.0 ** -8, torch.float16: 2 * 2.0 ** -11}


def run_both(case: Case, dtype: torch.dtype, seed: int = 0, share_table: bool = False):
    inputs = make_inputs(case, dtype, seed)
    ours_in, ref_in = clone_inputs(inputs), clone_inputs(inputs)
    ours = cpu_draft_attention(case.fields, **ours_in)
    rope = RotaryEmbedding.from_config(case.head_dim, case.theta, GPT_OSS_YARN if case.yarn else None)
    if share_table:
        rope.inv_freq = torch.from_numpy(rope_table(case.fields)[0])
    ref = draft_attention(**ref_in, rope=rope)
    return ours, ref, ours_in, ref_in


def angle_ulp_bound(case: Case, ctx_k: torch.Tensor) -> float:
    """One fp32 ulp of the largest angle (inverse frequency <= 1) times the largest rotated pair norm."""
    max_position = max((c + n for c, n in zip(case.cache_lens, case.ctx_lens)), default=0)
    return 2.0 ** -23 * max_position * 2 ** 0.5 * (ctx_k.float().abs().max().item() if ctx_k.numel() else 0.0)


def assert_close(case: Case, dtype: torch.dtype, ours, ref, ours_in, ref_in, cache_slack: bool = True) -> None:
    if dtype == torch.float32:
        tolerance = 1e-5
    else:
        tolerance = TOLERANCE_ULPS[dtype] * max(ref.float().abs().max().item(), 1.0)
    out_err = (ours.float() - ref.float()).abs().max().item()
    assert out_err <= tolerance, f"{case} {dtype}: out max abs error {out_err:.3g} > {tolerance:.3g}"
    for name in ("cache_k", "cache_v"):
        bound = tolerance + (angle_ulp_bound(case, ours_in["ctx_k"]) if cache_slack and name == "cache_k" else 0.0)
        cache_err = (ours_in[name].float() - ref_in[name].float()).abs().max().item()
        assert cache_err <= bound, f"{case} {dtype}: {name} max abs error {cache_err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("seed", range(10))
def test_fp32_matches_pytorch_reference_on_random_shapes(cpu_library, seed):
    case = random_case(random.Random(seed))
    assert_close(case, torch.float32, *run_both(case, torch.float32, seed))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_matches_pytorch_reference_within_stated_ulps(cpu_library, dtype, seed):
    case = random_case(random.Random(100 + seed), max_context=1024)
    assert_close(case, dtype, *run_both(case, dtype, seed))


@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_full_context_length_with_batch_of_four(cpu_library, head_dim, yarn):
    case = Case(4, 16, 8, 2, head_dim, 16, 2048, (2032, 0, 1000, 2048), (16, 0, 7, 0), 150000.0, yarn)
    assert_close(case, torch.float32, *run_both(case, torch.float32))


@pytest.mark.parametrize("seed", range(3))
def test_cache_matches_to_1e5_with_the_same_rope_table(cpu_library, seed):
    case = random_case(random.Random(200 + seed))
    assert_close(case, torch.float32, *run_both(case, torch.float32, seed, share_table=True), cache_slack=False)


def test_batching_gives_each_sequence_its_own_result(cpu_library):
    case = Case(3, 8, 4, 2, 64, 5, 64, (10, 0, 40), (5, 2, 0), 10000.0, False)
    inputs = make_inputs(case, torch.float32)
    together = cpu_draft_attention(case.fields, **clone_inputs(inputs))
    for b in range(case.batch):
        alone = {n: t[b:b + 1].clone() for n, t in inputs.items()}
        single = Case(1, 8, 4, 2, 64, 5, 64, case.cache_lens[b:b + 1], case.ctx_lens[b:b + 1], 10000.0, False)
        assert torch.equal(cpu_draft_attention(single.fields, **alone), together[b:b + 1])


def test_fp32_matches_independent_numpy_reference(cpu_library):
    case = Case(2, 8, 8, 2, 128, 5, 300, (250, 3), (5, 2), 1e6, True)
    inputs = make_inputs(case, torch.float32, seed=3)
    ours_in = clone_inputs(inputs)
    ours = cpu_draft_attention(case.fields, **ours_in)
    ref, ref_cache_k = numpy_draft_attention(inputs, case.head_dim, case.theta, GPT_OSS_YARN)
    assert abs(ours.double().numpy() - ref).max() < 1e-4
    assert abs(ours_in["cache_k"].double().numpy() - ref_cache_k).max() < 1e-4


def test_rejects_context_that_overflows_the_cache(cpu_library):
    case = Case(1, 4, 4, 4, 64, 8, 10, (5,), (8,), 10000.0, False)
    with pytest.raises(Exception, match="does not fit"):
        cpu_draft_attention(case.fields, **make_inputs(case, torch.float32))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_shape_sweep(cpu_library, dtype):
    rng = random.Random(7)
    for seed in range(40):
        case = random_case(rng)
        assert_close(case, dtype, *run_both(case, dtype, seed))
