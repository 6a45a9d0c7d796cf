"""OpenAI request validation of the gateway: what is accepted, and the 400s with the offending param."""

from __future__ import annotations

import pytest

from dflash_trt.gateway.errors import APIError
from dflash_trt.gateway.protocol import Sampling, parse_chat, parse_completion, parse_json


def completion(**body):
    return parse_completion({"model": "m", "prompt": "Hi", **body})


def chat(**body):
    return parse_chat({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body})


def rejected(call, **body) -> APIError:
    with pytest.raises(APIError) as error:
        call(**body)
    assert error.value.status == 400
    return error.value


def test_completion_defaults_follow_openai():
    request = completion()
    assert request.prompt == "Hi" and not request.stream and not request.echo
    assert request.sampling == Sampling(max_tokens=None, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=())


def test_completion_reads_every_supported_parameter():
    request = completion(max_tokens=7, temperature=0, top_p=0.5, top_k=3, seed=11, stop=["\n", "User:"], n=1,
                         stream=True, stream_options={"include_usage": True}, echo=True, user="u",
                         presence_penalty=0, logprobs=None, ignore_eos=True)
    assert request.sampling == Sampling(7, 0.0, 0.5, 3, 11, ("\n", "User:"), ignore_eos=True)
    assert request.stream and request.include_usage and request.echo


def test_logits_controls_are_read_on_both_endpoints():
    body = dict(presence_penalty=-2, frequency_penalty=1.5, min_tokens=4, max_tokens=4, repetition_penalty=1.2,
                bad_words=[" Paris", "", "New York"])
    for request in (completion(**body), chat(**body)):
        assert request.sampling == Sampling(max_tokens=4, presence_penalty=-2.0, frequency_penalty=1.5, min_tokens=4,
                                            repetition_penalty=1.2, bad_words=(" Paris", "New York"))
    assert completion(presence_penalty=2, frequency_penalty=-2).sampling.presence_penalty == 2.0  # the range's ends


def test_a_single_stop_string_and_a_one_prompt_list_are_accepted():
    request = completion(prompt=["Once"], stop="END")
    assert (request.prompt, request.sampling.stop) == ("Once", ("END",))


def test_chat_normalizes_text_parts_and_the_developer_role():
    request = parse_chat({"model": "m", "max_completion_tokens": 5, "chat_template_kwargs": {"enable_thinking": False},
                          "messages": [{"role": "developer", "content": "Be brief."},
                                       {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                                    {"type": "text", "text": "there"}]}]})
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert request.sampling.max_tokens == 5
    assert request.template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("body, param", [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"n": 2}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logprobs": 3}, "logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"frequency_penalty": "high"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 2.5}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
    ({"bad_words": "Paris"}, "bad_words"),
    ({"bad_words": ["Paris", 3]}, "bad_words"),
    ({"best_of": 2}, "best_of"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"model": ""}, "model"),
])
def test_completion_rejects_bad_parameters_naming_them(body, param):
    assert rejected(completion, **body).param == param


@pytest.mark.parametrize("messages", [
    [],
    "Hi",
    [{"role": "robot", "content": "Hi"}],
    [{"role": "user"}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
])
def test_chat_rejects_malformed_messages(messages):
    assert rejected(chat, messages=messages).param == "messages"


def test_chat_rejects_tools_and_completion_only_keys():
    assert rejected(chat, tools=[{"type": "function"}]).param == "tools"
    assert rejected(chat, echo=True).param == "echo"


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff", b""])
def test_a_body_that_is_not_a_json_object_is_a_400(raw):
    with pytest.raises(APIError) as error:
        parse_json(raw)
    assert error.value.status == 400
    assert error.value.body()["error"]["type"] == "invalid_request_error"


def test_error_body_has_openai_fields():
    error = rejected(completion, n=3)
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error", "param": "n",
                                      "code": None}}
    assert "n=1" in error.message
