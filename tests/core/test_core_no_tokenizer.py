"""A target saved without tokenizer files: token ids in and out, no stop id invented (as transformers' generate)."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt.cli import main

PROMPT = [3, 4, 5]


@pytest.fixture(scope="module")
def qwen3_without_tokenizer(tmp_path_factory):
    """A random Qwen3 (transformers 5 would build an empty Qwen2Tokenizer for it, eos = token 0) and a drafter."""
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("qwen3-no-tokenizer")
    model = make_tiny_target("qwen3", root / "target", vocab_size=16, seed=2)
    make_tiny_drafter(model.config, root / "drafter", block_size=4)
    return root, model


def test_has_no_tokenizer_and_no_default_stop_id(qwen3_without_tokenizer):
    from dflash_trt.decoding.model.target import has_tokenizer, load_target
    from dflash_trt.decoding.model.tokens import default_stop_ids

    root, _model = qwen3_without_tokenizer
    assert not has_tokenizer(root / "target")
    target = load_target(root / "target")
    assert target.tokenizer is None and default_stop_ids(target) == []


@pytest.mark.parametrize("with_drafter", [False, True])
def test_generate_equals_transformers_generate(qwen3_without_tokenizer, capsys, with_drafter):
    root, model = qwen3_without_tokenizer
    reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False)[0, len(PROMPT):].tolist()
    assert 0 in reference  # the id the fabricated tokenizer made a stop id
    args = ["generate", "--target", str(root / "target"), "--prompt-ids", ",".join(map(str, PROMPT)),
            "--max-new-tokens", "16", "--json"]
    if with_drafter:
        args += ["--drafter", str(root / "drafter")]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == reference and out["text"] is None and out["finish_reason"] == "length"


def test_text_prompts_are_refused_with_a_clear_message(qwen3_without_tokenizer, capsys):
    root, _model = qwen3_without_tokenizer
    code = main(["generate", "--target", str(root / "target"), "--prompt", "hello", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "has no tokenizer: pass token ids instead of text" in err
