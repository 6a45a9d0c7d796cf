"""Prompt preparation: verbatim text or a chat template, and the context limit."""

from __future__ import annotations

import pytest

from dflash_trt.serving.preprocess import Preprocessor
from dflash_trt.serving.requests import GenerationRequest, InvalidRequest, RequestLimits


def test_plain_text_is_tokenized_verbatim(smollm2_tokenizer):
    pre = Preprocessor(smollm2_tokenizer, RequestLimits())
    ids = pre.prompt_ids(GenerationRequest(text="Hello world", max_tokens=4))
    assert ids == smollm2_tokenizer.encode("Hello world")


def test_model_chat_template_wraps_the_text_as_a_user_turn(smollm2_tokenizer):
    pre = Preprocessor(smollm2_tokenizer, RequestLimits(), chat_template="model")
    text = smollm2_tokenizer.decode(pre.prompt_ids(GenerationRequest(text="Hello world", max_tokens=4)))
    assert "<|im_start|>user\nHello world<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_literal_template_is_used_as_given(smollm2_tokenizer):
    pre = Preprocessor(smollm2_tokenizer, RequestLimits(), chat_template="Q: {{ messages[0]['content'] }}\nA:")
    ids = pre.prompt_ids(GenerationRequest(text="why?", max_tokens=4))
    assert smollm2_tokenizer.decode(ids) == "Q: why?\nA:"


def test_rejects_a_prompt_longer_than_the_context(smollm2_tokenizer):
    pre = Preprocessor(smollm2_tokenizer, RequestLimits(max_tokens=16, max_context_tokens=32))
    with pytest.raises(InvalidRequest, match="exceeds the model's context of 32 tokens"):
        pre.prompt_ids(GenerationRequest(text="word " * 40, max_tokens=4))


def test_rejects_a_prompt_that_leaves_no_room_for_max_tokens(smollm2_tokenizer):
    pre = Preprocessor(smollm2_tokenizer, RequestLimits(max_tokens=16, max_context_tokens=32))
    pre.prompt_ids(GenerationRequest(text="word " * 10, max_tokens=4))
    with pytest.raises(InvalidRequest, match="plus max_tokens=16"):
        pre.prompt_ids(GenerationRequest(text="word " * 20, max_tokens=16))


def test_auto_uses_the_tokenizers_template_when_it_ships_one(smollm2_tokenizer):
    # The default of `dflash-trt repo`: an instruct target asked a bare question often answers nothing.
    pre = Preprocessor(smollm2_tokenizer, RequestLimits(), chat_template="auto")
    assert pre.chat_template == "model"
    text = smollm2_tokenizer.decode(pre.prompt_ids(GenerationRequest(text="Hello world", max_tokens=4)))
    assert "<|im_start|>user\nHello world<|im_end|>" in text


def test_auto_feeds_the_text_verbatim_when_the_tokenizer_has_no_template(smollm2_tokenizer):
    import copy

    base = copy.deepcopy(smollm2_tokenizer)
    base.chat_template = None  # a base model ships no template
    pre = Preprocessor(base, RequestLimits(), chat_template="auto")
    assert pre.prompt_ids(GenerationRequest(text="Hello world", max_tokens=4)) == base.encode("Hello world")


def test_the_repo_command_templates_by_default_and_none_turns_it_off(tiny_engine, tmp_path):
    import re

    from dflash_trt.cli import main

    for args, expected in (([], "auto"), (["--chat-template", "none"], "none")):
        out = tmp_path / expected
        assert main(["repo", "--engine", str(tiny_engine), "--out", str(out), *args]) == 0
        config = (out / "preprocessing" / "config.pbtxt").read_text()
        assert re.search(r'key: "chat_template" value: \{ string_value: "(\w+)" \}', config).group(1) == expected


@pytest.mark.parametrize("repo_template, templated", [("auto", True), ("none", False), ("model", True)])
def test_the_gateway_reads_auto_as_templated_when_the_tokenizer_has_a_template(tiny_engine, repo_template, templated):
    from dflash_trt.gateway.model import GatewayConfig, load_served_model

    class Triton:  # what tritonclient's get_model_config(as_json=True) returns for preprocessing
        def get_model_config(self, name, as_json):
            params = {"chat_template": repo_template, "engine_dir": str(tiny_engine), "max_tokens_limit": "64",
                      "max_context_tokens": "512"}
            return {"config": {"parameters": {k: {"string_value": v} for k, v in params.items()}}}

    assert load_served_model(GatewayConfig(), Triton()).is_templated_by_triton is templated
