"""The container entry point: arguments to steps, signal forwarding, health and runtime checks."""

import http.server
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash_trt.deploy import entrypoint
from dflash_trt.deploy.plan import DeployError


def _steps(*argv: str) -> list[list[str]]:
    return entrypoint.steps_for(entrypoint.build_parser().parse_args(list(argv)))


def _goals(steps: list[list[str]]) -> list[str]:
    return [step[4] for step in steps]


def test_serve_builds_then_serves_from_the_data_directory(tmp_path):
    steps = _steps("--project-dir", "/opt/dflash-trt", "--data-dir", str(tmp_path),
                   "serve", "--model", "smollm2-135m", "--tp", "1")
    assert _goals(steps) == ["engine", "repo", "serve"]
    assert f"REPO={tmp_path}/model_repository/smollm2-135m-tp1" in steps[-1]


def test_serve_takes_model_and_tp_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_MODEL", "gpt-oss-120b")
    monkeypatch.setenv("DFLASH_TP", "8")
    monkeypatch.setenv("DFLASH_DATA", str(tmp_path))
    steps = _steps("serve")
    assert "MODEL=gpt-oss-120b" in steps[0] and "TP=8" in steps[0]


def test_rejects_non_integer_tp_in_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_TP", "eight")
    assert entrypoint.main(["serve"]) == 2
    assert "DFLASH_TP='eight'" in capsys.readouterr().err


def test_serve_no_build_with_prepared_volume_runs_only_serve(tmp_path):
    repo = tmp_path / "repo"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text("")
    steps = _steps("serve", "--engine", str(tmp_path / "engine"), "--repo", str(repo), "--no-build",
                   "--openai-port", "9000", "--ready-timeout", "1800")
    assert _goals(steps) == ["serve"]
    assert {"OPENAI_PORT=9000", "READY_TIMEOUT=1800", "ADDRESS=0.0.0.0"} <= set(steps[0])


def test_engine_step_is_skipped_when_manifest_exists(tmp_path):
    engine = tmp_path / "engines" / "qwen3-8b-tp2"
    engine.mkdir(parents=True)
    (engine / "manifest.json").write_text("{}")
    args = ("--data-dir", str(tmp_path), "engine", "--model", "qwen3-8b", "--tp", "2")
    assert _steps(*args) == []
    assert _goals(_steps(*args, "--force")) == ["engine"]


def test_demo_runs_make_demo():
    assert _steps("--project-dir", "/p", "demo") == [["make", "-C", "/p", "--no-print-directory", "demo"]]


def test_reports_user_errors_in_one_line_with_status_2(tmp_path, capsys):
    assert entrypoint.main(["--data-dir", str(tmp_path), "serve", "--model", "m", "--tp", "3"]) == 2
    assert capsys.readouterr().err.strip() == "error: tensor-parallel size 3 is not supported (allowed: 1, 2, 4, 8)"


def test_unknown_first_word_runs_as_a_command(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execvp", lambda file, args: calls.append((file, args)))
    entrypoint.main(["bash", "-lc", "nvidia-smi"])
    assert calls == [("bash", ["bash", "-lc", "nvidia-smi"])]


class _RecordingSupervisor(entrypoint.Supervisor):
    def __init__(self, codes):
        super().__init__()
        self.codes = list(codes)
        self.ran = []

    def run(self, argv):
        self.ran.append(argv[4])
        return self.codes.pop(0)


def test_main_runs_steps_in_order(tmp_path):
    supervisor = _RecordingSupervisor([0, 0, 0])
    assert entrypoint.main(["--data-dir", str(tmp_path), "serve", "--model", "m"], supervisor) == 0
    assert supervisor.ran == ["engine", "repo", "serve"]


def test_failed_step_stops_the_sequence_with_its_status(tmp_path):
    supervisor = _RecordingSupervisor([3])
    assert entrypoint.main(["--data-dir", str(tmp_path), "serve", "--model", "m"], supervisor) == 3
    assert supervisor.ran == ["engine"]


_TRAPPING_CHILD = """
import signal, sys, time, pathlib
marker = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (marker.write_text("SIGTERM"), sys.exit(0)))
marker.write_text("started")
time.sleep(300)  # only slept in full when SIGTERM is not forwarded
"""


def _signal_self_when(marker: Path, text: str, signum: int) -> threading.Thread:
    def wait_and_signal():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (marker.exists() and marker.read_text() == text):
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_and_signal, daemon=True)
    thread.start()
    return thread


def test_forwards_sigterm_to_the_running_step_and_stops_after_it(tmp_path):
    marker = tmp_path / "marker"
    child = [sys.executable, "-c", _TRAPPING_CHILD, str(marker)]
    never = [sys.executable, "-c", f"open({str(tmp_path / 'second')!r}, 'w')"]
    _signal_self_when(marker, "started", signal.SIGTERM)
    assert entrypoint.Supervisor().run_steps([child, never]) == 128 + signal.SIGTERM
    assert marker.read_text() == "SIGTERM"  # the child's handler ran: it did not sleep its time out
    assert not (tmp_path / "second").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_child_killed_by_signal_reports_128_plus_signal(tmp_path):
    code = entrypoint.Supervisor().run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert code == 128 + signal.SIGKILL


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_health_is_zero_only_when_ready(health_server):
    assert entrypoint.main(["health", "--url", health_server + "/v2/health/ready"]) == 0
    assert entrypoint.main(["health", "--url", health_server + "/v2/health/live-not-ready"]) == 1


def test_health_fails_when_nothing_listens():
    assert entrypoint.main(["health", "--url", "http://127.0.0.1:9/v2/health/ready", "--timeout", "1"]) == 1


@pytest.mark.parametrize("version", ["1.4.0rc4", "1.4.0", "1.4.1", "2.0.0"])
def test_accepts_tensorrt_llm_from_the_floor_on(version):
    floor = entrypoint.MIN_TRTLLM_VERSION
    assert entrypoint.check_runtime(floor, lambda: version, lambda: "0.6.18") == \
        f"TensorRT-LLM {version} (>= {floor}), FlashInfer 0.6.18"


@pytest.mark.parametrize("version", ["1.4.0rc3", "1.4.0rc1", "1.3.0rc27", "1.3.0rc13", "1.3.0rc12", "1.2.1"])
def test_rejects_tensorrt_llm_older_than_the_floor(version):
    with pytest.raises(DeployError, match=f"TensorRT-LLM {version} is too old: DFlash serving needs >= 1.4.0rc4"):
        entrypoint.check_runtime(entrypoint.MIN_TRTLLM_VERSION, lambda: version, lambda: "0.6.18")


def test_rejects_an_image_without_flashinfer():
    with pytest.raises(DeployError, match="FlashInfer is not installed: .*use_rejection_sampling"):
        entrypoint.check_runtime(entrypoint.MIN_TRTLLM_VERSION, lambda: "1.4.0rc4", lambda: None)


def test_check_runtime_defaults_to_the_floor():
    args = entrypoint.build_parser().parse_args(["check-runtime"])
    assert args.min_trtllm == "1.4.0rc4"


def test_missing_tensorrt_llm_is_a_clear_error(capsys):
    if any(_installed(name) for name in ("tensorrt_llm", "tensorrt-llm")):
        pytest.skip("TensorRT-LLM is installed here")
    assert entrypoint.main(["check-runtime"]) == 2
    assert "TensorRT-LLM is not installed" in capsys.readouterr().err


def _installed(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_serve_passes_the_launcher_to_make_serve(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text("")
    common = ("serve", "--engine", str(tmp_path / "engine"), "--repo", str(repo), "--no-build")
    assert "LAUNCHER=mpirun" in _steps(*common, "--launcher", "mpirun")[-1]
    assert not any(word.startswith("LAUNCHER=") for word in _steps(*common)[-1])  # the Makefile's auto
    monkeypatch.setenv("DFLASH_LAUNCHER", "trtllm-llmapi-launch")
    assert "LAUNCHER=trtllm-llmapi-launch" in _steps(*common)[-1]


def test_waits_for_every_process_of_the_step_when_its_leader_exits_first(tmp_path):
    # make exits at once on SIGTERM while `dflash-trt serve`, which it started, is still draining: the entry
    # point (PID 1 of the container, or a subreaper) must wait for it, or the container would end the drain.
    marker = tmp_path / "drained"
    drainer = f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(marker)!r}).write_text('done')"
    leader = f"{shlex.quote(sys.executable)} -c {shlex.quote(drainer)} & exit 0"  # the leader leaves at once
    driver = (
        "import sys, pathlib\n"
        "from dflash_trt.deploy import entrypoint\n"
        "entrypoint.become_subreaper()\n"
        f"code = entrypoint.Supervisor().run(['sh', '-c', {leader!r}])\n"
        f"print(code, pathlib.Path({str(marker)!r}).exists())\n"
    )
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["0", "True"], result.stderr


def test_the_repository_gets_no_chat_template_when_the_openai_gateway_runs(tmp_path):
    base = ("--project-dir", "/opt/dflash-trt", "--data-dir", str(tmp_path), "serve", "--model", "smollm2-135m")
    (repo,) = [step for step in _steps(*base, "--openai-port", "9000") if step[4] == "repo"]
    assert "REPO_ARGS=--chat-template none" in repo
    (repo,) = [step for step in _steps(*base) if step[4] == "repo"]
    assert not any(arg.startswith("REPO_ARGS=") for arg in repo)  # `dflash-trt repo`'s default: auto
    prepare = _steps("--project-dir", "/opt/dflash-trt", "--data-dir", str(tmp_path), "prepare", "--model",
                     "smollm2-135m", "--chat-template", "none")
    assert "REPO_ARGS=--chat-template none" in prepare[-1]
