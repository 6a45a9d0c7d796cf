"""The torch face of the kernels without a GPU: the in-place op's CPU implementation (the C++ CPU twin), its schema,
the extension's nvcc command, a clean refusal on CPU-only torch, and (slow, with nvcc) that the extension's source
compiles against torch's headers."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from dflash_trt.plugin import cuda_op
from dflash_trt.plugin.library import cpu_draft_attention
from dflash_trt.plugin.torch_op import fields_to_list
from plugin_cases import Case, clone_inputs, make_inputs

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


def test_nvcc_command_targets_the_device_and_links_torch(tmp_path):
    command = cuda_op.nvcc_command("nvcc", ["/inc"], ["/lib"], (12, 0), True, tmp_path / "x.so")
    assert command[:2] == ["nvcc", "-shared"]
    assert "arch=compute_120,code=sm_120" in command and "-D_GLIBCXX_USE_CXX11_ABI=1" in command
    assert {"-lc10_cuda", "-ltorch_cuda"} <= set(command)
    sources = [c for c in command if c.endswith((".cu", ".cpp"))]
    assert len(sources) == len(cuda_op.SOURCES) and all(__import__("os").path.isfile(s) for s in sources)
    assert "arch=compute_90,code=sm_90" in cuda_op.nvcc_command("nvcc", [], [], (9, 0), False, tmp_path / "y")


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
    command = ["nvcc", "-c", "-std=c++20", "-O1", "-Xcompiler", "-fPIC", "-arch=sm_90",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *(f"-I{d}" for d in cpp_extension.include_paths()), f"-I{tmp_path / 'stub'}",
               f"-I{cuda_op.SOURCE_DIR}", str(cuda_op.SOURCE_DIR / "dflashAttentionTorch.cu"),
               "-o", str(tmp_path / "torch_op.o")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
