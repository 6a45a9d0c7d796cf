"""The TensorRT IPluginV3 library, checked through its exported entry points without TensorRT or a GPU.

Built only where TensorRT's headers are found (TENSORRT_ROOT, or the NGC image); skipped elsewhere.
"""

from __future__ import annotations

import subprocess

import pytest

from dflash_trt.decoding.kernels.plugin.build import CPU_TARGET, build_plugins, configured_targets


@pytest.mark.slow
def test_creator_rejects_bad_fields_and_round_trips_serialisation():
    summary = configured_targets(build_plugins((CPU_TARGET,)))
    if "dflash_attention_plugin_test" not in summary:
        pytest.skip(summary.strip())
    binary = build_plugins(("dflash_attention_plugin_test",)) / "bin" / "dflash_attention_plugin_test"
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "17 passed, 0 failed" in proc.stdout
    assert "field 'head_dim' = 96 is not supported" in proc.stderr
