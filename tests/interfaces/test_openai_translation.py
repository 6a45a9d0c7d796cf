"""The gateway's translation between OpenAI and the Triton ensemble: prompts, limits, tensors, responses."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.gateway import responses as out
from dflash_trt.gateway.errors import APIError
from dflash_trt.gateway.model import ServedModel
from dflash_trt.gateway.prompts import PromptFormatter
from dflash_trt.gateway.protocol import Sampling
from dflash_trt.gateway.triton import Piece, request_inputs, triton_error

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_text_pair_dir):
    return tiny_text_pair_dir / "target"


def template_ids(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_chat_prompt_is_the_tokenizers_template_text(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    formatter = PromptFormatter(tokenizer)
    text = formatter.chat_prompt(MESSAGES)
    assert text.endswith("<|im_start|>assistant\n") and "Be brief." in text
    assert tokenizer.encode(text) == template_ids(tokenizer, MESSAGES)


def test_a_tokenizer_that_adds_bos_does_not_get_it_twice(tokenizer_dir):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir), add_bos_token=True)
    assert tokenizer.encode("a")[0] == tokenizer.bos_token_id  # the template also starts with that token
    formatter = PromptFormatter(tokenizer)
    ids = tokenizer.encode(formatter.chat_prompt(MESSAGES))
    assert ids == template_ids(tokenizer, MESSAGES)
    assert formatter.count_tokens(formatter.chat_prompt(MESSAGES)) == len(ids)


def test_a_chat_template_file_replaces_the_tokenizers(tokenizer_dir):
    from transformers import AutoTokenizer

    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    formatter = PromptFormatter(AutoTokenizer.from_pretrained(str(tokenizer_dir)), template)
    assert formatter.chat_prompt(MESSAGES) == "system: Be brief.\nuser: Hi\nassistant:"


def test_chat_without_any_template_is_a_400(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.chat_template = None
    with pytest.raises(APIError, match="no chat template") as error:
        PromptFormatter(tokenizer).chat_prompt(MESSAGES)
    assert error.value.status == 400


def served(limit=100, context=120) -> ServedModel:
    return ServedModel("m", formatter=None, max_tokens_limit=limit, max_context_tokens=context, block_size=8)


def test_max_tokens_defaults_fit_the_limit_and_the_context():
    assert served().max_tokens(None, 10, 16, "prompt") == 16
    assert served().max_tokens(None, 10, None, "messages") == 100
    assert served().max_tokens(None, 110, None, "messages") == 10
    assert served().max_tokens(50, 10, 16, "prompt") == 50


@pytest.mark.parametrize("requested, num_prompt_tokens, message, code", [
    (101, 10, "max_tokens is too large: 101", None),
    (50, 100, "maximum context length is 120 tokens. However, you requested 150 tokens", "context_length_exceeded"),
    (None, 120, "the prompt has 120 tokens", "context_length_exceeded"),
])
def test_max_tokens_beyond_the_limits_is_a_400(requested, num_prompt_tokens, message, code):
    with pytest.raises(APIError, match=message) as error:
        served().max_tokens(requested, num_prompt_tokens, 16, "prompt")
    assert (error.value.status, error.value.code) == (400, code)


def test_request_tensors_use_the_ensemble_names_and_types():
    inputs = {t.name(): t for t in request_inputs("Hi", Sampling(temperature=0.5, top_p=0.9, top_k=4, seed=7,
                                                                  stop=("\n",)), 12)}
    assert {name: t.datatype() for name, t in inputs.items()} == {
        "text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32", "top_p": "FP32",
        "top_k": "INT32", "exclude_input_in_output": "BOOL", "seed": "UINT64", "stop_words": "BYTES"}
    assert all(t.shape() == [1, 1] for t in inputs.values())  # TensorRT-LLM's leading batch dimension


def test_several_stop_strings_go_as_one_batch_row():
    inputs = {t.name(): t for t in request_inputs("Hi", Sampling(stop=("\n", "User:")), 3)}
    assert inputs["stop_words"].shape() == [1, 2]


def test_no_seed_and_no_stop_words_send_no_tensors():
    names = {t.name() for t in request_inputs("Hi", Sampling(), 3)}
    assert "seed" not in names and "stop_words" not in names and "end_id" not in names


def test_ignore_eos_sends_end_id_minus_one():
    inputs = {t.name(): t for t in request_inputs("Hi", Sampling(ignore_eos=True), 3)}
    assert inputs["end_id"].datatype() == "INT32"
    assert np.frombuffer(inputs["end_id"]._get_content(), dtype=np.int32).tolist() == [-1]


def test_logits_controls_go_as_the_ensembles_tensorrt_llm_named_tensors():
    from tritonclient.utils import deserialize_bytes_tensor

    sampling = Sampling(min_tokens=5, bad_words=(" Paris", "New York"), repetition_penalty=1.25, presence_penalty=-0.5,
                        frequency_penalty=1.5)
    inputs = {t.name(): t for t in request_inputs("Hi", sampling, 8)}
    sent = {name: (inputs[name].datatype(), inputs[name].shape()) for name in
            ("min_tokens", "bad_words", "repetition_penalty", "presence_penalty", "frequency_penalty")}
    assert sent == {"min_tokens": ("INT32", [1, 1]), "bad_words": ("BYTES", [1, 2]),
                    "repetition_penalty": ("FP32", [1, 1]), "presence_penalty": ("FP32", [1, 1]),
                    "frequency_penalty": ("FP32", [1, 1])}
    values = {name: np.frombuffer(inputs[name]._get_content(), dtype=np.float32).tolist()
              for name in ("repetition_penalty", "presence_penalty", "frequency_penalty")}
    assert values == {"repetition_penalty": [1.25], "presence_penalty": [-0.5], "frequency_penalty": [1.5]}
    assert np.frombuffer(inputs["min_tokens"]._get_content(), dtype=np.int32).tolist() == [5]
    assert deserialize_bytes_tensor(inputs["bad_words"]._get_content()).tolist() == [b" Paris", b"New York"]


def test_neutral_logits_controls_send_no_tensors():
    names = {t.name() for t in request_inputs("Hi", Sampling(), 3)}
    assert not names & {"min_tokens", "bad_words", "repetition_penalty", "presence_penalty", "frequency_penalty"}


@pytest.mark.parametrize("message, status", [
    ("max_tokens must be in [1, 507], got 600", 400),
    ("generation failed: CUDA error", 500),
    ("postprocessing failed: bad window", 500),
    ("Exceeds maximum queue size", 429),
])
def test_triton_errors_map_to_http_statuses(message, status):
    assert triton_error(message).status == status


def test_an_input_the_runtime_cannot_honour_is_a_400_naming_the_parameter():
    # What the trtllm runtime answers for min_tokens under DFlash (serving/trtllm_admission.py).
    error = triton_error("input 'min_tokens' = 4 is not supported by the trtllm runtime: TensorRT-LLM cannot "
                         "apply it under speculative decoding (DFlash); send 0 or leave it out")
    assert error.status == 400
    assert error.body()["error"]["type"] == "invalid_request_error" and error.body()["error"]["param"] == "min_tokens"
    assert triton_error("top_p must be in (0, 1], got 0").body()["error"]["param"] is None


LAST = Piece(text="!", finish_reason="stop", num_output_tokens=9, total_draft_tokens=21,
             total_accepted_draft_tokens=6, acceptance_rate=6 / 21)


def test_dflash_field_reports_tau_over_the_servers_verify_steps():
    # The server counted 4 verify steps (the budget policy drafted 7, 7, 4 and 3): 6 accepted + 4 bonus tokens.
    counted = Piece(text="!", finish_reason="stop", num_output_tokens=10, total_draft_tokens=21,
                    total_accepted_draft_tokens=6, acceptance_rate=6 / 21, num_verify_steps=4)
    assert out.dflash_stats(counted, 8) == {"tau": 2.5, "num_draft_tokens": 21, "num_accepted_draft_tokens": 6,
                                            "num_verify_steps": 4, "acceptance_rate": round(6 / 21, 4),
                                            "block_size": 8}
    # A server that does not count them: 21 drafts at block size 8 taken as 3 full steps, tau 3.
    assert out.dflash_stats(LAST, 8)["tau"] == 3.0 and out.dflash_stats(LAST, 8)["num_verify_steps"] == 3
    assert out.dflash_stats(Piece("", "length", 1, 0, 0, 0.0), 8)["tau"] == 0.0


def test_full_responses_have_openai_shapes():
    chat = out.full_response(out.Reply("chat", "m"), "Hello!", LAST, 5, 8)
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    assert chat["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "logprobs": None,
                                "finish_reason": "stop"}]
    assert chat["usage"] == {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    cached = out.full_response(out.Reply("chat", "m"), "Hello!", Piece("!", "stop", 9, 21, 6, 6 / 21, 4), 5, 8)
    assert cached["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    text = out.full_response(out.Reply("completion", "m"), "Hello!", LAST, 5, 8)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "Hello!"


def test_stream_chunks_share_one_id_and_end_with_finish_reason():
    reply = out.Reply("chat", "m")
    chunks = [out.first_chunk(reply), out.text_chunk(reply, "Hel"), out.final_chunk(reply, LAST, 8),
              out.usage_chunk(reply, LAST, 5, 8)]
    assert {c["id"] for c in chunks} == {reply.id}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [{"role": "assistant", "content": ""},
                                                             {"content": "Hel"}, {"content": "!"}]
    assert chunks[2]["choices"][0]["finish_reason"] == "stop" and chunks[3]["choices"] == []
    assert out.sse(chunks[1]).startswith("data: {") and out.sse(chunks[1]).endswith("}\n\n")
    assert out.first_chunk(out.Reply("completion", "m")) is None



def test_the_companion_gateway_calls_triton_on_loopback_when_serving_on_every_interface():
    from dflash_trt.gateway.companion import gateway_command

    command = gateway_command(9000, 8001, "0.0.0.0", 300)
    assert command[command.index("--triton-grpc") + 1] == "127.0.0.1:8001"
    assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "9000"
    assert gateway_command(9000, 8001, "10.0.0.5", 300)[command.index("--triton-grpc") + 1] == "10.0.0.5:8001"


def test_a_repository_that_templates_itself_gets_the_bare_user_message(tokenizer_dir):
    from transformers import AutoTokenizer

    formatter = PromptFormatter(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    model = ServedModel("m", formatter, 100, 120, 8, is_templated_by_triton=True)
    sent, prompt = model.chat_prompt(MESSAGES[1:], {})
    assert sent == "Hi" and prompt == formatter.chat_prompt(MESSAGES[1:])
    for messages, kwargs in ((MESSAGES, {}), (MESSAGES[1:], {"enable_thinking": False})):
        with pytest.raises(APIError, match="single user message"):
            model.chat_prompt(messages, kwargs)
    with pytest.raises(APIError, match="chat/completions"):
        model.completion_prompt("Once upon a time")
    plain = ServedModel("m", formatter, 100, 120, 8)
    assert plain.chat_prompt(MESSAGES, {}) == (formatter.chat_prompt(MESSAGES),) * 2
    assert plain.completion_prompt("Once") == "Once"
