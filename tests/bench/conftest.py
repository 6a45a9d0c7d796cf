"""Fixtures of the benchmark tests: a tiny torch engine built from the tiny text pair (SmolLM2's tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bench_engine(tiny_text_pair_dir, tmp_path_factory) -> Path:
    """A torch engine of the tiny random pair (drafter block size 4), built through the engine builder."""
    from dflash_trt.engine.build import BuildRequest, build_engine

    out = tmp_path_factory.mktemp("bench-engine") / "engine"
    build_engine(BuildRequest(model="smollm2-135m", target=tiny_text_pair_dir / "target",
                              drafter=tiny_text_pair_dir / "drafter", block_size=4, out=out),
                 log=lambda _line: None)
    return out


@pytest.fixture(scope="session")
def bench_prompts(tmp_path_factory) -> Path:
    """Two families of two held-out prompts each, in the layout of data/prompts."""
    root = tmp_path_factory.mktemp("bench-prompts")
    for family, prompts in {"math": ["What is 2 + 3?", "Solve 4x = 8."],
                            "chat": ["Say hello.", "Name a colour."]}.items():
        (root / family).mkdir()
        lines = [f'{{"prompt": "{p}", "family": "{family}"}}' for p in prompts]
        (root / family / "heldout.jsonl").write_text("\n".join(lines) + "\n")
    return root
