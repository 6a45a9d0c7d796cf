"""`dflash-trt serve`: run tritonserver on a model repository in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.serving.launcher import LAUNCHERS
from dflash_trt.serving.server import ServerConfig


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
    parser.set_defaults(func=run)


def run(args) -> int:
    from dflash_trt.gateway.companion import gateway_beside
    from dflash_trt.serving.launcher import launcher_for_repository
    from dflash_trt.serving.server import serve_forever

    config = ServerConfig(model_repository=args.repo, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, address=args.address, ready_timeout_s=args.ready_timeout,
                          log_verbose=args.log_verbose, log_path=args.log_file, echo=not args.quiet,
                          launcher=tuple(launcher_for_repository(args.launcher, args.repo)))
    with gateway_beside(args.openai_port, args.grpc_port, args.address, args.ready_timeout):
        return serve_forever(config)
