"""Fixtures shared by every part of the suite: tiny random targets and drafters (CPU, seconds)."""

from __future__ import annotations

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
