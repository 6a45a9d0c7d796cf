"""The CUDA kernels through torch.ops.dflash.draft_attention_ against the PyTorch reference (needs a CUDA GPU and
nvcc; skipped otherwise). Outputs and both cache outputs, every dtype, both head dims, ragged batches, contexts
spanning several fixed splits, batch independence and CUDA graph replay."""

from __future__ import annotations

import random

import pytest
import torch
from plugin_cases import GPT_OSS_YARN, Case, clone_inputs, make_inputs, random_case

from dflash_trt.decoding.kernels.plugin.library import rope_table
from dflash_trt.gpu_check.tolerances import cache_error, output_error

PAIR_SLACK = 8 * 2.0 ** -24  # the kernel's sincosf against torch's cos/sin (gpu_check.kernel_checks.angle_slack)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_op():
    from dflash_trt.decoding.kernels.plugin import cuda_op, torch_op  # noqa: F401 - torch_op registers the ops

    cuda_op.load_cuda_op()
    return cuda_op


def reference(case: Case, inputs: dict, monkeypatch) -> tuple[torch.Tensor, dict]:
    from dflash_trt.decoding.kernels.attention import BACKEND_ENV, draft_attention
    from dflash_trt.decoding.kernels.rope import RotaryEmbedding

    monkeypatch.setenv(BACKEND_ENV, "torch")
    ref_in = clone_inputs(inputs)
    rope = RotaryEmbedding.from_config(case.head_dim, case.theta, GPT_OSS_YARN if case.yarn else None)
    # The plugin's own RoPE table: torch's may put an inverse frequency one fp32 ulp away (gpu_check.kernel_checks).
    table, factor = rope_table(case.fields)
    rope.inv_freq, rope.attention_factor = torch.from_numpy(table), factor
    out = draft_attention(**ref_in, rope=rope)
    monkeypatch.delenv(BACKEND_ENV)
    return out, ref_in


def run_kernel(case: Case, inputs: dict) -> tuple[torch.Tensor, dict]:
    from dflash_trt.decoding.kernels.plugin.fields import fields_to_list

    ours_in = clone_inputs(inputs)
    out = torch.ops.dflash.draft_attention_(**ours_in, fields=fields_to_list(case.fields))
    return out, ours_in


def check(case: Case, dtype: torch.dtype, monkeypatch, seed: int = 0) -> None:
    inputs = {k: v.cuda() for k, v in make_inputs(case, dtype, seed).items()}
    ours, ours_in = run_kernel(case, inputs)
    ref, ref_in = reference(case, inputs, monkeypatch)
    errors = [output_error(ours, ref)]
    errors += [cache_error(n, ours_in[n], ref_in[n], inputs[n], inputs["cache_lens"], inputs["ctx_lens"],
                           pair_slack=PAIR_SLACK) for n in ("cache_k", "cache_v")]
    errors = [e for e in errors if e]
    assert not errors, f"{case} {dtype}: {'; '.join(errors)}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(6))
def test_kernel_matches_reference_on_random_shapes(cuda_op, monkeypatch, dtype, seed):
    check(random_case(random.Random(seed), max_context=3000), dtype, monkeypatch, seed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_qwen3_8b_drafter_shape_ragged_over_several_splits(cuda_op, monkeypatch, dtype):
    case = Case(4, 16, 32, 8, 128, 16, 4200, (4000, 511, 0, 1500), (16, 1, 16, 7), 1e6, False)
    check(case, dtype, monkeypatch)


def test_gpt_oss_drafter_shape_with_yarn(cuda_op, monkeypatch):
    case = Case(2, 16, 64, 8, 64, 3, 2100, (2048, 700), (3, 2), 150000.0, True)
    check(case, torch.bfloat16, monkeypatch)


def test_a_sequence_drafts_the_same_bits_in_any_batch(cuda_op):
    case = Case(8, 16, 32, 8, 128, 1, 3000, (2900, 10, 1200, 64, 2999 - 1, 700, 0, 2048), (1,) * 8, 1e6, False)
    inputs = {k: v.cuda() for k, v in make_inputs(case, torch.bfloat16).items()}
    batched, _ = run_kernel(case, inputs)
    alone_case = Case(1, 16, 32, 8, 128, 1, 3000, (2900,), (1,), 1e6, False)
    alone, _ = run_kernel(alone_case, {k: v[:1] for k, v in inputs.items()})
    assert torch.equal(batched[:1], alone)


def test_cuda_graph_replay_matches_eager(cuda_op):
    from dflash_trt.decoding.kernels.plugin.fields import fields_to_list

    case = Case(2, 16, 32, 8, 128, 4, 1500, (1200, 300), (4, 2), 1e6, False)
    inputs = {k: v.cuda() for k, v in make_inputs(case, torch.bfloat16).items()}
    fields = fields_to_list(case.fields)
    eager_in = clone_inputs(inputs)
    eager = torch.ops.dflash.draft_attention_(**eager_in, fields=fields)
    graph_in = clone_inputs(inputs)
    torch.ops.dflash.draft_attention_(**clone_inputs(inputs), fields=fields)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.dflash.draft_attention_(**graph_in, fields=fields)
    for name in ("cache_k", "cache_v"):
        graph_in[name].copy_(inputs[name])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    assert torch.equal(graph_in["cache_k"], eager_in["cache_k"])
    assert torch.equal(graph_in["cache_v"], eager_in["cache_v"])


def test_functional_op_runs_the_kernel_and_leaves_its_inputs(cuda_op):
    from dflash_trt.decoding.kernels.plugin.fields import fields_to_list
    from dflash_trt.decoding.kernels.plugin.torch_op import draft_attention_op

    case = Case(1, 8, 8, 4, 64, 2, 64, (10,), (2,), 1e4, False)
    inputs = {k: v.cuda() for k, v in make_inputs(case, torch.float16).items()}
    before = clone_inputs(inputs)
    out, new_k, new_v = draft_attention_op(**inputs, fields=fields_to_list(case.fields))
    ours, ours_in = run_kernel(case, before)
    assert torch.equal(out, ours) and torch.equal(new_k, ours_in["cache_k"]) and torch.equal(new_v, ours_in["cache_v"])
    assert torch.equal(inputs["cache_k"], before["cache_k"])
