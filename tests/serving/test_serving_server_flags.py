"""tritonserver's command line: GPU metrics where the dflash model runs on CUDA, and a shared-memory prefix of
the Python stubs that is unique per server, so several servers can run on one host (as NVIDIA's launcher
arranges with --backend-config=python,shm-region-prefix-name)."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.serving.server_config import ServerConfig, server_command


def repo_on(tmp_path: Path, device: str) -> Path:
    (tmp_path / device / "dflash").mkdir(parents=True)
    (tmp_path / device / "dflash" / "config.pbtxt").write_text(
        f'parameters {{ key: "device" value: {{ string_value: "{device}" }} }}\n')
    return tmp_path / device


def flag(command: list[str], name: str) -> str:
    values = [word.split("=", 1)[1] for word in command if word.startswith(name + "=")]
    assert len(values) == 1, command
    return values[0]


def test_gpu_metrics_follow_the_device_of_the_dflash_model(tmp_path):
    assert flag(server_command(ServerConfig(repo_on(tmp_path, "cuda")), Path("/t")), "--allow-gpu-metrics") == "true"
    assert flag(server_command(ServerConfig(repo_on(tmp_path, "cpu")), Path("/t")), "--allow-gpu-metrics") == "false"
    assert flag(server_command(ServerConfig(tmp_path / "none"), Path("/t")), "--allow-gpu-metrics") == "false"


def test_each_server_gets_its_own_shared_memory_prefix(tmp_path):
    repo = repo_on(tmp_path, "cpu")
    first = flag(server_command(ServerConfig(repo, http_port=8000), Path("/t")), "--backend-config")
    second = flag(server_command(ServerConfig(repo, http_port=9000), Path("/t")), "--backend-config")
    assert first.startswith("python,shm-region-prefix-name=") and first != second
