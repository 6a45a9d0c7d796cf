"""The torch face of the kernels without a GPU: the in-place op's CPU implementation (the C++ CPU twin), its schema,
the extension's nvcc command, a clean refusal on CPU-only torch, and (slow, with nvcc) that the extension's source
compiles against torch's headers."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from plugin_cases import Case, clone_inputs, make_inputs

from dflash_trt.decoding.kernels.plugin import cuda_op
from dflash_trt.decoding.kernels.plugin.fields import fields_to_list
from dflash_trt.decoding.kernels.plugin.library import cpu_draft_attention

CASE = Case(2, 8, 8, 2, 64, 3, 40, (20, 5), (3, 1), 1e4, False)


def test_inplace_op_on_cpu_is_the_cpu_twin_and_updates_the_caches(cpu_library):
    inputs = make_inputs(CASE, torch.bfloat16)
    twin_in, op_in = clone_inputs(inputs), clone_inputs(inputs)
    expected = cpu_draft_attention(CASE.fields, **twin_in)
    out = torch.ops.dflash.draft_attention_(**op_in, fields=fields_to_list(CASE.fields))
    assert torch.equal(out, expected)
    assert torch.equal(op_in["cache_k"], twin_in["cache_k"]) and torch.equal(op_in["cache_v"], twin_in["cache_v"])
    assert not torch.equal(op_in["cache_k"], inputs["cache_k"])  # really written in place


def test_inplace_op_schema_declares_the_cache_mutations(cpu_library):
    inputs = make_inputs(CASE, torch.float32)
    torch.library.opcheck(torch.ops.dflash.draft_attention_.default,
                          tuple(inputs.values()) + (fields_to_list(CASE.fields),),
                          test_utils=("test_schema", "test_faketensor"))


def test_nvcc_commands_target_the_device_and_link_torch(tmp_path):
    compiles, link = cuda_op.nvcc_commands("nvcc", ["/inc"], ["/lib"], (12, 0), True, tmp_path / "x.so")
    sources = [c[c.index("-o") - 1] for c in compiles]
    assert sorted(os.path.basename(s) for s in sources) == sorted(cuda_op.SOURCES)
    assert all(os.path.isfile(s) for s in sources)
    for command in compiles:
        assert command[:2] == ["nvcc", "-c"] and "arch=compute_120,code=sm_120" in command
        assert "-D_GLIBCXX_USE_CXX11_ABI=1" in command and "-I/inc" in command
    objects = [c[-1] for c in compiles]
    assert link[:2] == ["nvcc", "-shared"] and all(o in link for o in objects) and link[-1] == str(tmp_path / "x.so")
    assert {"-lc10_cuda", "-ltorch_cuda", "-L/lib"} <= set(link)
    compiles, _ = cuda_op.nvcc_commands("nvcc", [], [], (9, 0), False, tmp_path / "y")
    assert "arch=compute_90,code=sm_90" in compiles[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_build_refuses_cleanly_without_cuda():
    with pytest.raises(cuda_op.CudaOpUnavailable, match="CUDA") as info:
        cuda_op.build_extension()
    assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_extension_source_compiles_against_torch_headers(tmp_path):
    from torch.utils import cpp_extension

    # A CPU-only torch wheel ships the c10/cuda headers but not the one CMake generates for CUDA builds.
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    compiles, _ = cuda_op.nvcc_commands("nvcc", [*cpp_extension.include_paths(), str(tmp_path / "stub")], [],
                                        (9, 0), torch._C._GLIBCXX_USE_CXX11_ABI, tmp_path / "x.so")
    command = next(c for c in compiles if "dflashAttentionTorch.cu" in c[-3])
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
