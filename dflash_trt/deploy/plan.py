"""What a deployment container runs: the project's `make` command lines, in order.

Pure functions of their arguments and of what already exists on disk (an engine is built when
its manifest.json exists; a model repository is rendered when it holds `<model>/config.pbtxt`),
so the tests check every decision without Docker, GPUs or a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_trt.engine.versions import version_key  # noqa: F401 (plan.version_key)
from dflash_trt.errors import ConfigError, DFlashError

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
ENGINE_MANIFEST = "manifest.json"
# Triton binds to loopback by default; inside a container the kubelet probes the pod IP.
CONTAINER_ADDRESS = "0.0.0.0"


class DeployError(DFlashError):
    """The container was started with arguments it cannot act on."""


@dataclass(frozen=True)
class Target:
    """The engine directory and model repository one container works on."""

    engine_dir: Path
    repo_dir: Path
    model: str | None = None  # engine preset; needed only when the engine must be built
    tensor_parallel: int = 1
    runtime: str | None = None  # None: the preset's default runtime
    quantization: str | None = None  # None: the preset's default quantization
    # `dflash-trt repo --chat-template`; None: its default, auto. "none" when the OpenAI gateway runs in front,
    # since it applies the template itself to whole conversations.
    chat_template: str | None = None


@dataclass(frozen=True)
class Ports:
    """Ports Triton (and the optional OpenAI gateway) listen on."""

    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002
    openai: int | None = None  # None: no OpenAI-compatible gateway
    # Model-aware /health/live and /health/ready of `dflash-trt serve` (the probes'; None: none).
    health: int | None = 8003


def default_name(model: str, tensor_parallel: int) -> str:
    """Directory name shared by engines/<name> and model_repository/<name>."""
    return f"{model}-tp{tensor_parallel}"


def resolve_target(
    data_dir: Path,
    model: str | None,
    tensor_parallel: int,
    engine_dir: Path | None = None,
    repo_dir: Path | None = None,
    runtime: str | None = None,
    quantization: str | None = None,
    chat_template: str | None = None,
) -> Target:
    """Fill in engine and repository paths under `data_dir` from the preset name when not given."""
    validate_tensor_parallel(tensor_parallel)
    if engine_dir is None or repo_dir is None:
        if not model:
            raise DeployError("give --model (to name engines/<model>-tp<n>) or both --engine and --repo")
        name = default_name(model, tensor_parallel)
        engine_dir = engine_dir or data_dir / "engines" / name
        repo_dir = repo_dir or data_dir / "model_repository" / name
    return Target(Path(engine_dir), Path(repo_dir), model or None, tensor_parallel, runtime or None, quantization or None,
                  chat_template or None)


def validate_tensor_parallel(tensor_parallel: int) -> None:
    if tensor_parallel not in TENSOR_PARALLEL_SIZES:
        allowed = ", ".join(map(str, TENSOR_PARALLEL_SIZES))
        raise DeployError(f"tensor-parallel size {tensor_parallel} is not supported (allowed: {allowed})")


def validate_ports(ports: Ports) -> None:
    named = {"http": ports.http, "grpc": ports.grpc, "metrics": ports.metrics}
    if ports.openai is not None:
        named["openai"] = ports.openai
    if ports.health is not None:
        named["health"] = ports.health
    for name, port in named.items():
        if not 1 <= port <= 65535:
            raise DeployError(f"{name} port {port} is outside 1..65535")
    if len(set(named.values())) != len(named):
        raise DeployError(f"ports must differ: {named}")


def make_command(project_dir: Path, goal: str, **variables: object) -> list[str]:
    """`make -C <project> <goal> NAME=value ...`; variables that are None are left out."""
    assignments = [f"{name}={value}" for name, value in variables.items() if value is not None]
    return ["make", "-C", str(project_dir), "--no-print-directory", goal, *assignments]


def engine_command(project_dir: Path, target: Target) -> list[str]:
    if not target.model:
        raise DeployError(f"no engine at {target.engine_dir} ({ENGINE_MANIFEST} missing) and no --model to build one")
    return make_command(
        project_dir,
        "engine",
        MODEL=target.model,
        TP=target.tensor_parallel,
        OUT=target.engine_dir,
        RUNTIME=target.runtime,
        QUANT=target.quantization,
    )


def repo_command(project_dir: Path, target: Target) -> list[str]:
    repo_args = f"--chat-template {target.chat_template}" if target.chat_template else None
    return make_command(project_dir, "repo", ENGINE=target.engine_dir, OUT=target.repo_dir, REPO_ARGS=repo_args)


def serve_command(
    project_dir: Path, repo_dir: Path, ports: Ports, address: str = CONTAINER_ADDRESS, ready_timeout_s: int | None = None,
    launcher: str | None = None,
) -> list[str]:
    """`make serve` on all interfaces; READY_TIMEOUT lets a 120B engine load longer than the launcher's default.

    LAUNCHER picks how tritonserver starts (serving/launcher.py; None keeps the Makefile's auto: mpirun for
    TensorRT-LLM engines, as NVIDIA's Triton launcher does).
    """
    validate_ports(ports)
    return make_command(
        project_dir,
        "serve",
        REPO=repo_dir,
        HTTP_PORT=ports.http,
        GRPC_PORT=ports.grpc,
        METRICS_PORT=ports.metrics,
        OPENAI_PORT=ports.openai,
        HEALTH_PORT=ports.health,
        ADDRESS=address,
        READY_TIMEOUT=ready_timeout_s,
        LAUNCHER=launcher,
    )


def is_engine_built(engine_dir: Path) -> bool:
    return (Path(engine_dir) / ENGINE_MANIFEST).is_file()


def is_repo_rendered(repo_dir: Path) -> bool:
    return any(Path(repo_dir).glob("*/config.pbtxt"))


def prepare_steps(project_dir: Path, target: Target, force: bool = False) -> list[list[str]]:
    """Build the engine unless its manifest exists, then render the repository unless it exists.

    Rebuilding the engine always re-renders the repository, so the two never disagree.
    """
    steps = []
    build_engine = force or not is_engine_built(target.engine_dir)
    if build_engine:
        steps.append(engine_command(project_dir, target))
    if build_engine or not is_repo_rendered(target.repo_dir):
        steps.append(repo_command(project_dir, target))
    return steps


def serve_steps(
    project_dir: Path,
    target: Target,
    ports: Ports,
    build: bool = True,
    address: str = CONTAINER_ADDRESS,
    ready_timeout_s: int | None = None,
    launcher: str | None = None,
) -> list[list[str]]:
    """Prepare what is missing (when `build`), then serve; without `build` the repository must exist."""
    if build:
        steps = prepare_steps(project_dir, target)
    elif is_repo_rendered(target.repo_dir):
        steps = []
    else:
        raise DeployError(
            f"no model repository at {target.repo_dir} (no <model>/config.pbtxt inside); "
            "mount a prepared volume or run `prepare` first"
        )
    return steps + [serve_command(project_dir, target.repo_dir, ports, address, ready_timeout_s, launcher)]


def release_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; pre-releases count as their release ("1.3.0rc11" -> (1, 3))."""
    try:
        return version_key(version)[:2]
    except ConfigError as error:
        raise DeployError(str(error)) from None
