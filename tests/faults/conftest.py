"""The fault suite: the real `dflash-trt serve` (tritonserver 2.51, the HTTP guard, the supervisor) on a tiny
engine, hurt on purpose. Each module starts its own server(s) as a subprocess, as a deployment runs it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fault_repo(tiny_text_pair_dir, tmp_path_factory) -> Path:
    """A tiny torch engine (random Llama with SmolLM2's tokenizer, random drafter) rendered as a repository:
    one dflash instance, the block size pinned, small limits."""
    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.serving.repo import RepoConfig, render_repository

    root = tmp_path_factory.mktemp("fault-engine")
    build_engine(BuildRequest(model="smollm2-135m", target=tiny_text_pair_dir / "target",
                              drafter=tiny_text_pair_dir / "drafter", out=root / "engine", block_size=4),
                 log=lambda _line: None)
    render_repository(RepoConfig(root / "engine", root / "repo", dflash_instances=1, max_tokens_limit=256,
                                 max_context_tokens=512, num_threads=1, block_policy="fixed"))
    return root / "repo"
