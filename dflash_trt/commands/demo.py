"""`dflash-trt demo`: the embedded demo pair (SmolLM2-135M-Instruct + its DFlash drafter) on the CPU.

By default the whole product path runs: build the default engine (idempotent), render its Triton
repository, serve it, stream one answer over gRPC printing tau, stop the server, then time the same
prompt in process with DFlash and with plain decoding (tokens/s of each; --no-compare skips it). --in-process
generates in this process instead, without Triton.
"""

from __future__ import annotations

from pathlib import Path

from dflash_trt.data.demo import DEMO_DRAFTER, DEMO_PROMPT, demo_target_path
from dflash_trt.errors import DFlashError


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the embedded demo pair on the CPU")
    parser.add_argument("--prompt", default=DEMO_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--in-process", action="store_true", help="generate in this process, without Triton")
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="skip timing the same prompt in process with DFlash and with plain decoding")
    parser.set_defaults(func=run)


def run(args) -> int:
    if not (DEMO_DRAFTER / "config.json").is_file():
        raise DFlashError(f"the demo drafter is missing at {DEMO_DRAFTER}")
    if not args.in_process:
        return run_served(args)
    from dflash_trt.cli import main

    return main(["generate", "--target", str(demo_target_path()), "--drafter", str(DEMO_DRAFTER), "--chat",
                 "--prompt", args.prompt, "--max-new-tokens", str(args.max_new_tokens)])


def run_served(args) -> int:
    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.serving.demo import compare_with_plain, served_answer

    engine_dir = build_engine(BuildRequest(), log=lambda line: print(line, flush=True)).engine_dir
    repo_dir = Path(__file__).resolve().parents[2] / "model_repository" / engine_dir.name
    served_answer(engine_dir, repo_dir, args.prompt, args.max_new_tokens, chat_template="model",
                  write=lambda line: print(line, flush=True))
    if args.compare:
        print("timing the same prompt in process, DFlash against plain decoding ...", flush=True)
        print(compare_with_plain(engine_dir, args.prompt, args.max_new_tokens).describe(), flush=True)
    return 0
