"""`dflash-trt serve`: run tritonserver on a model repository in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_trt.serving.launcher import LAUNCHERS
from dflash_trt.serving.server import ServerConfig

DRAIN_ENV = "DFLASH_DRAIN_TIMEOUT"
GUARD_CHOICES = {"auto": None, "on": True, "off": False}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"error: environment variable {name}={value!r} is not a whole number of seconds") from None


def register(subparsers) -> None:
    defaults = ServerConfig(model_repository=Path("."))
    parser = subparsers.add_parser("serve", help="serve a model repository with Triton (foreground)",
                                   description="Start the tritonserver shipped with nvidia-pytriton, wait until it "
                                               "is ready, and keep it running until interrupted.")
    parser.add_argument("--repo", type=Path, required=True, help="model repository (rendered by `dflash-trt repo`)")
    parser.add_argument("--http-port", type=int, default=defaults.http_port)
    parser.add_argument("--grpc-port", type=int, default=defaults.grpc_port)
    parser.add_argument("--metrics-port", type=int, default=defaults.metrics_port)
    parser.add_argument("--address", default=defaults.address,
                        help=f"address to bind (default: {defaults.address}; 0.0.0.0 in containers)")
    parser.add_argument("--ready-timeout", type=float, default=defaults.ready_timeout_s,
                        help=f"seconds to wait for the models to load (default: {defaults.ready_timeout_s:.0f})")
    parser.add_argument("--log-file", type=Path, help="also write the server log here")
    parser.add_argument("--quiet", action="store_true", help="do not echo the server log")
    parser.add_argument("--log-verbose", type=int, default=defaults.log_verbose, help="Triton's --log-verbose level")
    parser.add_argument("--openai-port", type=int,
                        help="also run the OpenAI-compatible gateway (`dflash-trt openai`) on this port")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                        help="start tritonserver plainly or under mpirun as NVIDIA does for TensorRT-LLM "
                             "(default auto: mpirun for trtllm engines)")
    parser.add_argument("--drain-timeout", type=int, default=_env_int(DRAIN_ENV, defaults.exit_timeout_s),
                        help="seconds in-flight requests may take to finish after SIGTERM before every server "
                             f"process is killed (env {DRAIN_ENV}; default: {defaults.exit_timeout_s})")
    parser.add_argument("--health-port", type=int,
                        help="serve model-aware /health/live and /health/ready on this port (default: none)")
    parser.add_argument("--max-restarts", type=int, default=defaults.max_restarts,
                        help="restarts of a server whose model process died before giving up with an error "
                             f"(default: {defaults.max_restarts}; 0 = exit at once)")
    parser.add_argument("--http-guard", choices=sorted(GUARD_CHOICES), default="auto",
                        help="put the guarding HTTP front before Triton's HTTP port (default auto: for Triton "
                             "older than 2.69, whose JSON parser crashes on deep nesting)")
    parser.add_argument("--max-json-depth", type=int, default=defaults.max_json_depth,
                        help=f"guard: deepest JSON nesting accepted (default: {defaults.max_json_depth})")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes,
                        help=f"guard: largest HTTP body accepted (default: {defaults.max_body_bytes})")
    parser.set_defaults(func=run)


def run(args) -> int:
    from dflash_trt.errors import DFlashError
    from dflash_trt.gateway.companion import gateway_beside
    from dflash_trt.serving.launcher import launcher_for_repository
    from dflash_trt.serving.supervisor import serve_forever

    if args.drain_timeout < 0:
        raise DFlashError(f"--drain-timeout must be >= 0 seconds, got {args.drain_timeout}")
    if args.max_restarts < 0:
        raise DFlashError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.max_json_depth < 1 or args.max_body_bytes < 1:
        raise DFlashError("--max-json-depth and --max-body-bytes must be positive")
    config = ServerConfig(model_repository=args.repo, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, address=args.address, ready_timeout_s=args.ready_timeout,
                          exit_timeout_s=args.drain_timeout, log_verbose=args.log_verbose, log_path=args.log_file,
                          echo=not args.quiet, launcher=tuple(launcher_for_repository(args.launcher, args.repo)),
                          http_guard=GUARD_CHOICES[args.http_guard], max_json_depth=args.max_json_depth,
                          max_body_bytes=args.max_body_bytes, health_port=args.health_port,
                          max_restarts=args.max_restarts)
    with gateway_beside(args.openai_port, args.grpc_port, args.address, args.ready_timeout, args.health_port):
        return serve_forever(config)
