"""The gateway's front against hostile input, through its real FastAPI app (Starlette's TestClient).

Every request here is refused before it reaches Triton (the app points at a port nobody listens on), so
each case checks the gateway's own answer: status, OpenAI's error body, and that the app keeps serving.
"""

from __future__ import annotations

import json
import threading

import pytest

from dflash_trt.gateway.app import create_app
from dflash_trt.gateway.model import GatewayConfig, ServedModel
from dflash_trt.gateway.prompts import PromptFormatter
from dflash_trt.serving.requests import MAX_WORD_BYTES, MAX_WORDS

KEY = "sk-test-key"
CONTEXT = 64


@pytest.fixture(scope="module")
def tokenizer(tiny_text_pair_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_text_pair_dir / "target"))


def make_client(tokenizer, api_key=None, formatter=None):
    from fastapi.testclient import TestClient

    from dflash_trt.serving.server import free_ports

    model = ServedModel("m", formatter or PromptFormatter(tokenizer), max_tokens_limit=32,
                        max_context_tokens=CONTEXT, block_size=8)
    config = GatewayConfig(triton_grpc=f"127.0.0.1:{free_ports(1)[0]}", api_key=api_key)
    return TestClient(create_app(config, model)), model


@pytest.fixture(scope="module")
def client(tokenizer):
    test_client, _ = make_client(tokenizer, api_key=KEY)
    with test_client:
        yield test_client


AUTH = {"Authorization": f"Bearer {KEY}"}


def post(client, path, body, headers=None, raw=None):
    headers = {"Content-Type": "application/json", **AUTH, **(headers or {})}
    return client.post(path, content=raw if raw is not None else json.dumps(body), headers=headers)


def assert_openai_error(response, status, param=None, code=None, match=""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert match in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code


def still_serving(client):
    return client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == "m"


@pytest.mark.parametrize("headers, message", [
    ({}, "You didn't provide an API key"),
    ({"Authorization": "Bearer wrong"}, "Incorrect API key"),
    ({"Authorization": f"Basic {KEY}"}, "Incorrect API key"),
    ({"Authorization": KEY}, "Incorrect API key"),
])
def test_without_the_api_key_every_v1_route_is_a_401(client, headers, message):
    for response in (client.get("/v1/models", headers=headers),
                     client.post("/v1/completions", json={"model": "m", "prompt": "hi"}, headers=headers)):
        assert_openai_error(response, 401, code="invalid_api_key", match=message)
    assert still_serving(client)


def test_the_api_key_is_optional_and_health_never_asks_for_it(tokenizer):
    open_client, _ = make_client(tokenizer)
    with open_client:
        assert open_client.get("/v1/models").status_code == 200
    # /health answers without a key (probes send none); 503 because no Triton listens here.
    assert client_health_status(tokenizer) == 503


def client_health_status(tokenizer):
    keyed, _ = make_client(tokenizer, api_key=KEY)
    with keyed:
        return keyed.get("/health").status_code


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_post_that_is_not_declared_json_is_a_415(client, content_type):
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1})
    for path in ("/v1/completions", "/v1/chat/completions"):
        response = client.post(path, content=body, headers=headers)
        assert_openai_error(response, 415, code="unsupported_media_type", match="Content-Type must be application/json")
    assert still_serving(client)


def test_json_with_a_charset_is_json(client):
    response = post(client, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 10**6},
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert_openai_error(response, 400, param="max_tokens")  # got past the media-type check


def test_no_cors_headers_are_sent_even_to_a_preflight(client):
    origin = {"Origin": "https://evil.example"}
    preflight = client.options("/v1/completions", headers={**origin, "Access-Control-Request-Method": "POST"})
    plain = client.get("/v1/models", headers={**origin, **AUTH})
    for response in (preflight, plain):
        assert not any(name.lower().startswith("access-control-") for name in response.headers)


def test_a_body_over_the_bound_is_a_413_without_being_read_whole(client, tokenizer):
    _, model = make_client(tokenizer)
    raw = b'{"model": "m", "prompt": "' + b"a" * model.max_body_bytes + b'"}'
    response = post(client, "/v1/completions", None, raw=raw)
    assert_openai_error(response, 413, code="request_too_large")
    assert still_serving(client)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "word " * (CONTEXT * 7)}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * (CONTEXT * 7)}]}, "messages"),
])
def test_a_prompt_over_the_byte_limit_is_refused_before_it_is_tokenized(tokenizer, path, body, param):
    counted = []
    formatter = PromptFormatter(tokenizer)
    formatter.count_tokens = lambda text: counted.append(text) or 1
    test_client, model = make_client(tokenizer, formatter=formatter)
    with test_client:
        response = post(test_client, path, {"model": "m", **body})
    assert_openai_error(response, 400, param=param, code="context_length_exceeded",
                        match=f"this server accepts at most {model.prompt_bytes_limit} bytes")
    assert counted == []


def test_a_lone_surrogate_is_a_400_naming_the_field(client):
    for path, raw in (("/v1/completions", b'{"model": "m", "prompt": "a\\ud800b"}'),
                      ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "\\udfff"}]}'),
                      ("/v1/completions", b'{"model": "m", "prompt": "hi", "stop": ["\\ud83d"]}')):
        response = post(client, path, None, raw=raw)
        assert_openai_error(response, 400, match="lone UTF-16 surrogate")
    assert response.json()["error"]["param"] == "stop"
    assert still_serving(client)


@pytest.mark.parametrize("body, param, message", [
    ({"max_tokens": 2**32 + 8}, "max_tokens", "max_tokens is too large: 4294967304"),
    ({"max_tokens": 33}, "max_tokens", "max_tokens is too large: 33"),
    ({"top_k": 2**31}, "top_k", "top_k must be in [0, 2147483647]"),
    ({"min_tokens": 2**40}, "min_tokens", "min_tokens must be in [0, 2147483647]"),
    ({"max_tokens": "8"}, "max_tokens", "max_tokens must be an integer"),
    ({"temperature": "hot"}, "temperature", "temperature must be a number"),
    ({"stream": "yes"}, "stream", "stream must be a boolean"),
    ({"bad_words": ["w"] * (MAX_WORDS + 1)}, "bad_words", f"at most {MAX_WORDS} are accepted"),
    ({"bad_words": ["w" * (MAX_WORD_BYTES + 1)]}, "bad_words", f"each entry may have at most {MAX_WORD_BYTES}"),
    ({"stop": ["s" * (MAX_WORD_BYTES + 1)]}, "stop", f"each entry may have at most {MAX_WORD_BYTES}"),
    ({"max_tokenz": 8}, "max_tokenz", "Unrecognized request argument supplied: max_tokenz"),
])
def test_values_triton_would_mangle_or_drop_are_400s_here(client, body, param, message):
    response = post(client, "/v1/completions", {"model": "m", "prompt": "hi", **body})
    assert_openai_error(response, 400, param=param, match=message)
    assert still_serving(client)


def test_unknown_keys_inside_a_message_are_refused_and_openais_own_accepted(client):
    bad = post(client, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi",
                                                                             "colour": "red"}]})
    assert_openai_error(bad, 400, param="messages", match="Unrecognized key(s) in messages[0]: colour")
    ok = post(client, "/v1/chat/completions", {"model": "m", "max_tokens": 10**6, "store": False, "metadata": {},
                                               "messages": [{"role": "user", "content": "hi", "name": "ann"}]})
    assert_openai_error(ok, 400, param="max_tokens")  # every key passed; only the deliberate max_tokens is wrong


def test_tokenizing_runs_off_the_event_loop(tokenizer):
    """While one request is being tokenized (held here until /v1/models has answered), the app keeps serving:
    were tokenization on the event loop, /v1/models could not answer and the wait below would time out."""
    release, tokenizing = threading.Event(), threading.Event()
    formatter = PromptFormatter(tokenizer)

    def slow_count(text):
        tokenizing.set()
        assert release.wait(timeout=60), "never released"
        return len(tokenizer.encode(text))

    formatter.count_tokens = slow_count
    test_client, _ = make_client(tokenizer, formatter=formatter)
    with test_client:
        result = {}
        worker = threading.Thread(target=lambda: result.update(
            response=post(test_client, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 10**6})))
        worker.start()
        assert tokenizing.wait(timeout=120)
        models = test_client.get("/v1/models")
        release.set()
        worker.join(timeout=120)
    assert models.status_code == 200
    assert result["response"].status_code == 400  # max_tokens, once counted
