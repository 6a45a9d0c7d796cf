"""How tritonserver is run: the ServerConfig of `dflash-trt serve` and the command line it becomes (ports, the
private HTTP port behind the guard, the Python backend's shared-memory prefix, GPU metrics, restricted admin APIs).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.serving.admin_apis import admin_key_from_env, restricted_api_options


@dataclass
class ServerConfig:
    """How to run tritonserver. Ports 0 are not allowed: Triton needs fixed ports."""

    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = "127.0.0.1"
    ready_timeout_s: float = 300.0
    # Drain: after SIGTERM Triton lets in-flight requests finish for this long (--exit-timeout-secs); then
    # every process of the server is killed.
    exit_timeout_s: int = 30
    # The guarding HTTP front (http_guard.py): None = on when the Triton is older than 2.69 (its JSON parser
    # crashes on deep nesting), True/False to force it.
    http_guard: bool | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    max_json_depth: int = 100
    # serve_forever only: model-aware health endpoints on this port (health.py; None = none), and how often a
    # server whose tritonserver or model process died is restarted before giving up with an error.
    health_port: int | None = None
    max_restarts: int = 3
    log_verbose: int = 0
    log_path: Path | None = None
    echo: bool = False
    # Words before tritonserver: () or `mpirun --allow-run-as-root -n 1 [trtllm-llmapi-launch]` (launcher.py)
    launcher: tuple[str, ...] = ()
    # The admin key that opens Triton's restricted APIs (admin_apis.py); None: its variable, else a random key.
    admin_key: str | None = None

    @property
    def http_url(self) -> str:
        return f"http://{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{self.metrics_port}/metrics"


# The first Triton whose JSON parser is iterative (triton-inference-server/common#156, in r26.05 = 2.69.0).
SAFE_JSON_TRITON = (2, 69)


def triton_version(home: Path) -> tuple[int, int] | None:
    """(major, minor) of a Triton installation from its TRITON_VERSION file (NGC images have one;
    nvidia-pytriton's 2.51 has none), else None."""
    try:
        major, minor = (home / "TRITON_VERSION").read_text().strip().split(".")[:2]
        return int(major), int(minor)
    except (OSError, ValueError):
        return None


def needs_http_guard(config: ServerConfig, home: Path) -> bool:
    if config.http_guard is not None:
        return config.http_guard
    version = triton_version(home)
    return version is None or version < SAFE_JSON_TRITON


def server_command(config: ServerConfig, home: Path, http_port: int | None = None,
                   shm_prefix: str | None = None) -> list[str]:
    """The tritonserver command line; `http_port` moves Triton's HTTP to a private loopback port (behind the
    guard), `shm_prefix` names the Python backend's shared-memory regions (default: shm_region_prefix)."""
    http_address = config.address if http_port is None else "127.0.0.1"
    backend_config = [f"--backend-config=python,shm-region-prefix-name={shm_prefix or shm_region_prefix(config)}"]
    return [
        *config.launcher,
        str(home / "bin" / "tritonserver"),
        f"--model-repository={Path(config.model_repository).resolve()}",
        f"--backend-directory={home / 'backends'}",
        *backend_config,
        f"--http-address={http_address}",
        f"--http-port={config.http_port if http_port is None else http_port}",
        f"--grpc-address={config.address}",
        f"--grpc-port={config.grpc_port}",
        f"--metrics-address={config.address}",
        f"--metrics-port={config.metrics_port}",
        f"--allow-gpu-metrics={'true' if repository_device(config.model_repository) == 'cuda' else 'false'}",
        f"--exit-timeout-secs={config.exit_timeout_s}",
        f"--log-verbose={config.log_verbose}",
        *restricted_api_options(config.admin_key or admin_key_from_env()),
    ]


_DEVICE = re.compile(r'key:\s*"device"\s*value:\s*\{\s*string_value:\s*"([a-z]+)"')


def repository_device(repo: Path) -> str:
    """The device the repository's dflash model runs on ("cpu" when it cannot be read): Triton's GPU metrics
    (utilization, memory, power) are exported for "cuda"."""
    config = Path(repo) / "dflash" / "config.pbtxt"
    match = _DEVICE.search(config.read_text()) if config.is_file() else None
    return match.group(1) if match else "cpu"


def shm_region_prefix(config: ServerConfig) -> str:
    """A shared-memory prefix of this server's Python stubs, unique on the host: servers that share one
    (the backend's default) collide in /dev/shm, which is why NVIDIA's launcher passes one per server."""
    return f"dflash_{os.getpid()}_{config.http_port}_"
