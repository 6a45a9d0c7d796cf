"""nvcc compiles and links the CUDA kernels for sm_90, sm_100 and sm_120 (no GPU needed; skipped without nvcc)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from dflash_trt.decoding.kernels.plugin.build import CPU_TARGET, CUDA_TARGETS, build_plugins, configured_targets


@pytest.fixture(scope="module")
def kernel_test_binary():
    summary = configured_targets(build_plugins((CPU_TARGET,)))
    if "skipped: CUDA kernels" in summary:
        pytest.skip(summary)
    return build_plugins(CUDA_TARGETS) / "bin" / "dflash_attention_kernel_test"


def embedded_architectures(binary) -> set[str]:
    """SM architectures of the cubins in a binary: cuobjdump when installed, else the fatbin's arch strings."""
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        text = subprocess.run([cuobjdump, "--list-elf", str(binary)], capture_output=True, text=True,
                              check=True).stdout
    else:
        text = binary.read_bytes().decode("latin-1")
    return set(re.findall(r"sm_\d+", text))


@pytest.mark.slow
def test_kernels_compile_for_sm90_sm100_and_sm120(kernel_test_binary):
    # sm_120 (RTX 50 / RTX PRO Blackwell) has the smallest shared memory of the targets (99 KB per CTA).
    assert {"sm_90", "sm_100", "sm_120"} <= embedded_architectures(kernel_test_binary)


@pytest.mark.slow
def test_kernel_test_program_reports_missing_gpu_cleanly(kernel_test_binary):
    # Without a GPU the program must fail with a CUDA error message, not crash; with one it must pass.
    proc = subprocess.run([str(kernel_test_binary), "--quick"], capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        assert "0 failed" in proc.stdout
    else:
        assert proc.returncode == 2 and "CUDA error" in proc.stderr, proc.stdout + proc.stderr
