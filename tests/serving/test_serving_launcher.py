"""The tritonserver launcher: readiness, load failures reported instead of hangs, stub installation."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dflash_trt.serving.server import TritonServer, explain_load_errors, load_errors
from dflash_trt.serving.triton_home import STUB_NAME, ServerError, install_python_stub, server_env

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""
ECHO = """import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text + b"!"], dtype=object))]))
        return responses
"""


def make_repo(root: Path, name: str, model_py: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (root / name / "1" / "model.py").write_text(model_py)
    return root


def infer(server, name, text):
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1], "datatype": "BYTES", "data": [text]}]}).encode()
    request = urllib.request.Request(f"{server.config.http_url}/v2/models/{name}/infer", data=body)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["outputs"][0]["data"][0]


def test_serves_a_trivial_python_model_and_stops_cleanly(tmp_path, server_config):
    with TritonServer(server_config(make_repo(tmp_path, "echo", ECHO), ready_timeout_s=180)) as server:
        assert infer(server, "echo", "hi") == "hi!"
    assert server.returncode is not None


def test_load_failure_reports_the_models_error_without_waiting(tmp_path, server_config):
    repo = make_repo(tmp_path, "broken", "import module_that_does_not_exist\n")
    # The headline tells the load error seen in the log apart from the ready timeout running out.
    with pytest.raises(ServerError, match="a model failed to load(.|\n)*module_that_does_not_exist"):
        with TritonServer(server_config(repo, ready_timeout_s=600)):
            pass


def test_gives_up_after_the_ready_timeout_and_stops_the_server(tmp_path, server_config):
    slow = "import time\nclass TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(120)\n"
    server = TritonServer(server_config(make_repo(tmp_path, "slow", slow), ready_timeout_s=3, exit_timeout_s=2))
    with pytest.raises(ServerError, match="not ready after 3 s"):
        with server:
            pass
    assert server.returncode is not None


def test_serve_on_free_ports_tries_other_ports_when_one_is_taken(tmp_path, monkeypatch):
    import socket

    from dflash_trt.serving import server as server_module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = server_module.free_ports
    offers = iter([[real(1)[0], taken.getsockname()[1], real(1)[0]]])
    monkeypatch.setattr(server_module, "free_ports", lambda n: next(offers, None) or real(n))
    try:
        with server_module.serve_on_free_ports(make_repo(tmp_path, "echo", ECHO), ready_timeout_s=180) as server:
            assert server.config.grpc_port != taken.getsockname()[1]
            assert infer(server, "echo", "again") == "again!"
    finally:
        taken.close()


def test_load_errors_picks_the_failure_lines():
    log = "I0 loading: dflash:1\nE1 model_lifecycle.cc] \"failed to load 'dflash' version 1: boom\"\nI2 other\n"
    assert load_errors(log) == ["E1 model_lifecycle.cc] \"failed to load 'dflash' version 1: boom\""]


def test_load_errors_are_explained_per_model_with_their_traceback():
    log = ('E1 model_lifecycle.cc:642] "failed to load \'dflash\' version 1: Internal: ValueError: bad engine'
           '\\n\\nAt:\\n  model.py(3): initialize\\n"\nI2 done\n')
    assert explain_load_errors(log) == ["model 'dflash': Internal: ValueError: bad engine\n\nAt:\n  model.py(3): initialize"]


def test_stub_installation_is_idempotent(tmp_path):
    stub = tmp_path / "python_backend_stubs" / "3.11" / STUB_NAME
    stub.parent.mkdir(parents=True)
    stub.write_bytes(b"\x7fELF stub")
    (tmp_path / "backends" / "python").mkdir(parents=True)
    installed = install_python_stub(tmp_path, "3.11")
    assert installed.read_bytes() == b"\x7fELF stub" and os.access(installed, os.X_OK)
    first_mtime = installed.stat().st_mtime_ns
    install_python_stub(tmp_path, "3.11")
    assert installed.stat().st_mtime_ns == first_mtime


def test_missing_stub_names_the_available_versions(tmp_path):
    (tmp_path / "python_backend_stubs" / "3.12").mkdir(parents=True)
    with pytest.raises(ServerError, match=r"no Python backend stub for Python 3.9 \(available: 3.12\)"):
        install_python_stub(tmp_path, "3.9")


def test_environment_puts_this_interpreter_first():
    import sysconfig

    env = server_env({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[:2] == [sysconfig.get_config_var("LIBDIR"), "/opt/lib"]


def test_a_full_triton_installation_is_used_from_its_variable(tmp_path, monkeypatch):
    from dflash_trt.serving.triton_home import triton_home

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tritonserver").write_text("")
    (tmp_path / "backends" / "python").mkdir(parents=True)
    (tmp_path / "backends" / "python" / STUB_NAME).write_text("")
    monkeypatch.setenv("DFLASH_TRITON_HOME", str(tmp_path))
    assert triton_home() == tmp_path
    assert install_python_stub(tmp_path) == tmp_path / "backends" / "python" / STUB_NAME


def test_a_triton_home_without_a_server_is_refused(tmp_path, monkeypatch):
    from dflash_trt.serving.triton_home import triton_home

    monkeypatch.setenv("DFLASH_TRITON_HOME", str(tmp_path))
    with pytest.raises(ServerError, match="DFLASH_TRITON_HOME=.*no bin/tritonserver"):
        triton_home()


def test_a_server_that_ignores_sigterm_is_killed_after_the_drain_and_a_second_stop_waits_for_nothing(
        tmp_path, monkeypatch, server_config, capfd):
    """The stop is bounded: a tritonserver still running exit_timeout_s + EXIT_MARGIN_S after SIGTERM is killed
    with every process of its group, and says so on stderr (also with the log not echoed)."""
    from dflash_trt.serving.server import EXIT_MARGIN_S

    home = tmp_path / "triton"
    (home / "bin").mkdir(parents=True)
    (home / "backends" / "python").mkdir(parents=True)
    (home / "backends" / "python" / STUB_NAME).write_text("")
    stubborn = home / "bin" / "tritonserver"
    stubborn.write_text(f"#!{sys.executable}\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "print('ignoring SIGTERM', flush=True)\ntime.sleep(300)\n")
    stubborn.chmod(0o755)
    monkeypatch.setenv("DFLASH_TRITON_HOME", str(home))
    server = TritonServer(server_config(tmp_path, exit_timeout_s=1, echo=False)).start()
    while "ignoring SIGTERM" not in server.log:  # its handler is in place before the signal comes
        assert server.returncode is None, server.log
        time.sleep(0.05)
    assert server.stop() == -signal.SIGKILL
    message = f"tritonserver still running {1 + EXIT_MARGIN_S} s after SIGTERM: killing its processes"
    assert message in capfd.readouterr().err and message in server.log

    def no_more_waiting(*_):
        raise AssertionError("a second stop went through the stop again")

    from dflash_trt.serving import model_processes

    monkeypatch.setattr(model_processes, "kill_group", no_more_waiting)
    monkeypatch.setattr(server, "_stop_guard", no_more_waiting)
    assert server.stop() == -signal.SIGKILL
