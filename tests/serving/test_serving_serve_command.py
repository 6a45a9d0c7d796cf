"""`dflash-trt serve` in the foreground: says where it listens, stops on SIGTERM, fails fast on a bad model."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from dflash_trt.serving.server import free_ports

ECHO = '''import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([b"ok"], dtype=object))])
                for _ in requests]
'''
CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
'''


def repo_with(root: Path, name: str, code: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (root / name / "1" / "model.py").write_text(code)
    return root


# Bounds of a stop: the drain, Triton's exit margin, the guard's stop and the log pump (server.py), well inside
# the test's wait however loaded the machine.
DRAIN_S = 10
STOP_WAIT_S = 90


def serve(repo: Path) -> subprocess.Popen:
    http, grpc, metrics = free_ports(3)
    command = [sys.executable, "-m", "dflash_trt.cli", "serve", "--repo", str(repo), "--quiet",
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
               "--ready-timeout", "120", "--drain-timeout", str(DRAIN_S)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serves_until_sigterm_and_says_where_it_listens(tmp_path):
    process = serve(repo_with(tmp_path, "echo", ECHO))
    try:
        line = process.stdout.readline()
        assert line.startswith("Triton is ready: HTTP http://127.0.0.1:"), line + process.stderr.read()
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"serve still running {STOP_WAIT_S} s after SIGTERM\nstdout:\n{out}\n"
                                 f"stderr:\n{err}") from None
        assert status == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
    assert f"stopping tritonserver (draining for up to {DRAIN_S} s)" in process.stdout.read()


def test_a_model_that_cannot_load_makes_serve_fail_with_its_error(tmp_path):
    process = serve(repo_with(tmp_path, "broken", "import module_that_does_not_exist\n"))
    try:
        assert process.wait(timeout=120) == 2
    finally:
        if process.poll() is None:
            process.kill()
    error = process.stderr.read()
    assert error.startswith("error: a model failed to load") and "model 'broken': " in error
    assert "module_that_does_not_exist" in error
