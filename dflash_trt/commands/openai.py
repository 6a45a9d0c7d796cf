"""`dflash-trt openai`: the OpenAI-compatible HTTP gateway in front of a running Triton server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dflash_trt.gateway.model import GatewayConfig

API_KEY_ENV = "DFLASH_TRT_API_KEY"


def register(subparsers) -> None:
    defaults = GatewayConfig()
    parser = subparsers.add_parser(
        "openai", help="serve /v1/completions and /v1/chat/completions in front of Triton",
        description="OpenAI-compatible gateway: validates requests, applies the chat template and streams "
                    "from the Triton ensemble over gRPC. Tokenizer and limits come from the server's repository.")
    parser.add_argument("--triton-grpc", default=defaults.triton_grpc, metavar="HOST:PORT",
                        help=f"Triton's gRPC address (default: {defaults.triton_grpc})")
    parser.add_argument("--host", default=defaults.host, help=f"address to listen on (default: {defaults.host})")
    parser.add_argument("--port", type=int, default=defaults.port, help=f"port to listen on (default: {defaults.port})")
    parser.add_argument("--served-model-name", help="model name clients send (default: the engine's name)")
    parser.add_argument("--engine", type=Path, dest="engine_dir",
                        help="engine directory as seen from here (default: the one the repository names)")
    parser.add_argument("--chat-template", type=Path, help="Jinja chat template file (default: the tokenizer's)")
    parser.add_argument("--ensemble", default=defaults.ensemble, help=f"Triton model to call (default: "
                                                                      f"{defaults.ensemble})")
    parser.add_argument("--ready-timeout", type=float, default=defaults.ready_timeout_s, dest="ready_timeout_s",
                        help=f"seconds to wait for Triton (default: {defaults.ready_timeout_s:.0f})")
    parser.add_argument("--server-health-url", metavar="URL",
                        help="model-aware readiness of `dflash-trt serve` (http://HOST:PORT/health/ready) that "
                             "/health asks before Triton (set by `dflash-trt serve --openai-port --health-port`)")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on /v1 routes (default: the "
                                           f"{API_KEY_ENV} environment variable; none: open). Prefer the variable: "
                                           "a command line is visible to every user of the machine")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from dflash_trt.errors import DFlashError
    from dflash_trt.gateway.app import create_app
    from dflash_trt.gateway.model import load_served_model, wait_for_triton

    if args.chat_template is not None and not args.chat_template.is_file():
        raise DFlashError(f"--chat-template {args.chat_template}: file not found")
    config = GatewayConfig(triton_grpc=args.triton_grpc, host=args.host, port=args.port,
                           served_model_name=args.served_model_name, engine_dir=args.engine_dir,
                           chat_template=args.chat_template, ensemble=args.ensemble,
                           ready_timeout_s=args.ready_timeout_s, server_health_url=args.server_health_url,
                           api_key=args.api_key or os.environ.get(API_KEY_ENV) or None)
    # The gateway's own lines (client disconnects) go to stdout; uvicorn's stay at warning.
    gateway_log = logging.getLogger("dflash_trt.gateway")
    gateway_log.setLevel(logging.INFO)
    gateway_log.addHandler(logging.StreamHandler(sys.stdout))
    client = wait_for_triton(config, log=lambda line: print(line, flush=True))
    model = load_served_model(config, client)
    client.close()
    print(f"OpenAI-compatible API on http://{config.host}:{config.port}/v1 serving '{model.name}' "
          f"(Triton gRPC {config.triton_grpc}; {'API key required' if config.api_key else 'no API key'})",
          flush=True)
    uvicorn.run(create_app(config, model), host=config.host, port=config.port, log_level="warning",
                timeout_graceful_shutdown=5)
    return 0
