"""Which implementation the drafter's attention runs: the CUDA op for CUDA tensors (falling back to PyTorch with one
warning when it cannot be built, unless DFLASH_DRAFT_ATTENTION=cuda), PyTorch for CPU tensors and unsupported heads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash_trt.decoding.kernels import attention
from dflash_trt.decoding.kernels.plugin import cuda_op
from dflash_trt.decoding.kernels.rope import RotaryEmbedding

ROPE = RotaryEmbedding(128, 1e6)


def fake(is_cuda: bool, head_dim: int = 128, heads: int = 32):
    return SimpleNamespace(is_cuda=is_cuda, shape=(2, 16, heads, head_dim))


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(attention, "_cuda_unavailable", None)
    monkeypatch.delenv(attention.BACKEND_ENV, raising=False)


def test_cuda_tensors_run_the_inplace_op_with_the_rope_fields(monkeypatch):
    monkeypatch.setattr(cuda_op, "load_cuda_op", lambda: None)
    op, fields = attention._cuda_backend(fake(True), fake(True, heads=8), ROPE)
    assert op._qualname == "dflash::draft_attention_"
    assert fields[:3] == [32.0, 8.0, 128.0] and fields[4] == 1e6


def test_cpu_tensors_and_the_torch_backend_use_the_reference(monkeypatch):
    monkeypatch.setattr(cuda_op, "load_cuda_op", lambda: pytest.fail("must not build"))
    assert attention._cuda_backend(fake(False), fake(False), ROPE) is None
    monkeypatch.setenv(attention.BACKEND_ENV, "torch")
    assert attention._cuda_backend(fake(True), fake(True), ROPE) is None


def test_unbuildable_op_falls_back_once_with_a_warning(monkeypatch):
    calls = []

    def unavailable():
        calls.append(1)
        raise cuda_op.CudaOpUnavailable("no nvcc")

    monkeypatch.setattr(cuda_op, "load_cuda_op", unavailable)
    with pytest.warns(RuntimeWarning, match="no nvcc"):
        assert attention._cuda_backend(fake(True), fake(True), ROPE) is None
    assert attention._cuda_backend(fake(True), fake(True), ROPE) is None
    assert calls == [1]  # not retried on every layer
    monkeypatch.setattr(attention, "_cuda_unavailable", None)
    monkeypatch.setenv(attention.BACKEND_ENV, "cuda")
    with pytest.raises(cuda_op.CudaOpUnavailable):
        attention._cuda_backend(fake(True), fake(True), ROPE)


def test_head_dims_the_kernels_lack_use_the_reference_without_disabling_the_op(monkeypatch):
    monkeypatch.setattr(cuda_op, "load_cuda_op", lambda: None)
    assert attention._cuda_backend(fake(True, head_dim=96), fake(True, head_dim=96), RotaryEmbedding(96, 1e4)) is None
    assert attention._cuda_unavailable is None
    assert attention._cuda_backend(fake(True), fake(True, heads=8), ROPE) is not None
