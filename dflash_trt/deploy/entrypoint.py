"""Entry point of the dflash-trt container images.

    serve          prepare what is missing (engine, repository), then `make serve` on all interfaces
    prepare        `make engine` unless engines/<name>/manifest.json exists, then `make repo` (init container)
    engine         `make engine` only
    repo           `make repo` only
    demo           `make demo` (CPU image)
    health         exit 0 when a health URL answers 200: by default the model-aware /health/ready of
                   `dflash-trt serve` (Docker HEALTHCHECK); `helm test` asks Triton's /v2/health/ready
    check-runtime  fail unless the installed TensorRT-LLM is recent enough for DFlash (GPU image build)

Any other first word runs as a command (`docker run IMAGE bash`). Defaults come from the
environment (DFLASH_HOME, DFLASH_DATA, DFLASH_MODEL, DFLASH_TP, DFLASH_LAUNCHER) so that an image can
preset them. `serve` starts tritonserver under `mpirun -n 1` for TensorRT-LLM engines (serving/launcher.py).
The container's PID 1 is this process: it forwards SIGTERM/SIGINT to the whole process group of
the step it runs, so Kubernetes' stop signal reaches `dflash-trt serve` through make, and it waits until
every process of that group has ended: make exits at once on SIGTERM, while the server drains its
in-flight requests (DFLASH_DRAIN_TIMEOUT) and cleans up; a PID 1 that returned early would end them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

from dflash_trt.deploy import plan
from dflash_trt.deploy.plan import DeployError, Ports
from dflash_trt.engine.artifacts.trtllm_schema import MIN_TRTLLM_VERSION
from dflash_trt.serving.launcher import LAUNCHERS

COMMANDS = ("serve", "prepare", "engine", "repo", "demo", "health", "check-runtime")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise DeployError(f"environment variable {name}={value!r} is not an integer") from None


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=os.environ.get("DFLASH_MODEL"), help="engine preset (env DFLASH_MODEL)")
    parser.add_argument("--tp", type=int, default=_env_int("DFLASH_TP", plan.Target.tensor_parallel),
                        help="tensor-parallel size: 1, 2, 4 or 8 (env DFLASH_TP)")
    parser.add_argument("--engine", type=Path, help="engine directory (default: $DFLASH_DATA/engines/<model>-tp<n>)")
    parser.add_argument("--repo", type=Path,
                        help="model repository (default: $DFLASH_DATA/model_repository/<model>-tp<n>)")
    parser.add_argument("--runtime", help="engine runtime: torch, onnx, tensorrt or trtllm (default: the preset's)")
    parser.add_argument("--quantization", help="none, fp8, nvfp4 or mxfp4 (default: the preset's)")
    parser.add_argument("--chat-template", default=os.environ.get("DFLASH_CHAT_TEMPLATE"),
                        help="the repository's chat template: auto (default), none (the OpenAI gateway templates "
                             "whole conversations itself), model or a Jinja file (env DFLASH_CHAT_TEMPLATE)")


def _add_port_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Ports()
    parser.add_argument("--http-port", type=int, default=defaults.http)
    parser.add_argument("--grpc-port", type=int, default=defaults.grpc)
    parser.add_argument("--metrics-port", type=int, default=defaults.metrics)
    parser.add_argument("--openai-port", type=int, default=defaults.openai,
                        help="also start the OpenAI-compatible gateway on this port")
    parser.add_argument("--health-port", type=int, default=defaults.health,
                        help="model-aware /health/live and /health/ready of the server (the probes')")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="entrypoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--project-dir", type=Path, default=Path(os.environ.get("DFLASH_HOME") or Path.cwd()),
                        help="checkout holding the Makefile (env DFLASH_HOME)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where engines/ and model_repository/ live (env DFLASH_DATA; default: project dir)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="prepare what is missing, then serve")
    _add_target_arguments(serve)
    _add_port_arguments(serve)
    serve.add_argument("--no-build", dest="build", action="store_false",
                       help="never build: the repository must already exist (prepared volume)")
    serve.add_argument("--address", default=plan.CONTAINER_ADDRESS, help="address Triton binds to")
    serve.add_argument("--ready-timeout", type=int, default=None, help="seconds `make serve` waits for readiness")
    serve.add_argument("--launcher", choices=LAUNCHERS, default=os.environ.get("DFLASH_LAUNCHER") or None,
                       help="how tritonserver starts (env DFLASH_LAUNCHER; default: auto, mpirun -n 1 for "
                            "TensorRT-LLM engines as NVIDIA does)")

    for name, text in (("prepare", "build the engine and render the repository if missing"),
                       ("engine", "build the engine only")):
        step = sub.add_parser(name, help=text)
        _add_target_arguments(step)
        step.add_argument("--force", action="store_true", help="rebuild even if the manifest exists")

    repo = sub.add_parser("repo", help="render the model repository from an engine")
    _add_target_arguments(repo)
    sub.add_parser("demo", help="run `make demo`")

    health = sub.add_parser("health", help="check Triton's readiness endpoint")
    health.add_argument("--url", default=f"http://127.0.0.1:{Ports().health}/health/ready")
    health.add_argument("--timeout", type=float, default=5.0)

    check = sub.add_parser("check-runtime", help="check the TensorRT-LLM version")
    check.add_argument("--min-trtllm", default=MIN_TRTLLM_VERSION)
    return parser


def _target(args: argparse.Namespace) -> plan.Target:
    return plan.resolve_target(_data_dir(args), args.model, args.tp, args.engine, args.repo,
                               args.runtime, args.quantization, args.chat_template)


def _data_dir(args: argparse.Namespace) -> Path:
    return args.data_dir or Path(os.environ.get("DFLASH_DATA") or args.project_dir)


def steps_for(args: argparse.Namespace) -> list[list[str]]:
    """The command lines a parsed `serve`/`prepare`/`engine`/`repo`/`demo` invocation runs, in order."""
    project = args.project_dir
    if args.command == "demo":
        return [plan.make_command(project, "demo")]
    target = _target(args)
    if args.command == "serve":
        ports = Ports(args.http_port, args.grpc_port, args.metrics_port, args.openai_port, args.health_port)
        if ports.openai is not None and target.chat_template is None:
            target = dataclasses.replace(target, chat_template="none")  # the gateway templates conversations
        return plan.serve_steps(project, target, ports, args.build, args.address, args.ready_timeout, args.launcher)
    if args.command == "prepare":
        return plan.prepare_steps(project, target, force=args.force)
    if args.command == "engine":
        built = plan.is_engine_built(target.engine_dir) and not args.force
        return [] if built else [plan.engine_command(project, target)]
    return [plan.repo_command(project, target)]


class Supervisor:
    """Runs one step at a time as its own process group and forwards stop signals to it."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self._child: subprocess.Popen | None = None

    def _forward(self, signum: int, _frame: object) -> None:
        self.stop_signal = signum
        if self._child is not None and self._child.poll() is None:
            try:
                os.killpg(self._child.pid, signum)
            except ProcessLookupError:
                pass

    def run(self, argv: Sequence[str]) -> int:
        """Exit status of `argv`; a child killed by signal N reports 128 + N like a shell.

        Returns only when every process of the child's group has ended (see wait_for_group)."""
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED_SIGNALS}
        try:
            self._child = subprocess.Popen(list(argv), start_new_session=True)
            code = self._child.wait()
            wait_for_group(self._child.pid)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._child = None
        return 128 - code if code < 0 else code

    def run_steps(self, steps: Sequence[Sequence[str]]) -> int:
        """Run steps in order; stop at the first failure or after a stop signal."""
        for argv in steps:
            print("+ " + shlex.join(argv), file=sys.stderr, flush=True)
            code = self.run(argv)
            if code != 0:
                return code
            if self.stop_signal is not None:
                return 128 + self.stop_signal
        return 0


def become_subreaper() -> None:
    """Orphans of our children are re-parented to this process instead of init (Linux), so that we can wait
    for them; in a container this process is init already."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def wait_for_group(pgid: int) -> None:
    """Reap processes of group `pgid` until none of them is our child: make may exit before `dflash-trt serve`,
    which it started, has finished draining; a subreaper (become_subreaper) inherits it and waits for it here."""
    while True:
        try:
            os.waitpid(-pgid, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def is_ready(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def installed_trtllm_version() -> str:
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise DeployError("TensorRT-LLM is not installed in this image (DFlash serving on GPUs needs it)")


def installed_flashinfer_version() -> str | None:
    for name in ("flashinfer-python", "flashinfer"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_runtime(minimum: str, version_of: Callable[[], str] = installed_trtllm_version,
                  flashinfer_of: Callable[[], str | None] = installed_flashinfer_version) -> str:
    """One line naming the installed TensorRT-LLM and FlashInfer; DeployError when TensorRT-LLM is older than
    `minimum` or FlashInfer is missing (the trtllm options turn on use_rejection_sampling, whose one-model path
    needs FlashInfer per TensorRT-LLM's DecodingBaseConfig; so does the TRTLLM draft attention)."""
    version = version_of()
    if plan.version_key(version) < plan.version_key(minimum):
        raise DeployError(f"TensorRT-LLM {version} is too old: DFlash serving needs >= {minimum} (admission "
                          "refusals under speculation, filled acceptance counters, DFlash 1.4 fields); choose a "
                          "newer base image")
    flashinfer = flashinfer_of()
    if flashinfer is None:
        raise DeployError("FlashInfer is not installed: TensorRT-LLM's rejection sampling for DFlash at temperature > 0 "
                          "(speculative_config.use_rejection_sampling) needs it; choose a base image that ships "
                          "flashinfer-python")
    return f"TensorRT-LLM {version} (>= {minimum}), FlashInfer {flashinfer}"


def main(argv: Sequence[str] | None = None, supervisor: Supervisor | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        return os.execvp(argv[0], argv)  # `docker run IMAGE bash`: this process becomes the command
    try:
        args = build_parser().parse_args(argv)
        if args.command == "health":
            return 0 if is_ready(args.url, args.timeout) else 1
        if args.command == "check-runtime":
            print(check_runtime(args.min_trtllm))
            return 0
        return (supervisor or Supervisor()).run_steps(steps_for(args))
    except DeployError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    become_subreaper()
    sys.exit(main())
