"""Hostile input against the real tritonserver (and the OpenAI gateway in front of it): each bad request gets
the right 4xx with a clear message, and the server still answers a normal request afterwards.

Where Triton 2.51 mangles a value before any model runs (a max_tokens beyond INT32 wraps around, a JSON
value of the wrong type is its 500, a full queue its 400), the tests pin that behaviour, which the README
documents, and check that the gateway, the strict front, refuses or maps it properly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dflash_trt.serving.requests import MAX_WORD_BYTES, MAX_WORDS

pytestmark = pytest.mark.slow

CONTEXT = 256
API_KEY = "sk-faults"
ADMIN_KEY = "faults-admin"
GATE_POLL_S = 0.02


# --- the server: a tiny random Llama with SmolLM2's tokenizer, one sequence at a time, a queue of one ---------

@pytest.fixture(scope="module")
def engine(tiny_engine) -> Path:
    return tiny_engine  # tests/conftest.py: a tiny random Llama with SmolLM2's tokenizer


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Path:
    """The dflash model's step gate (dflash_trt/serving/cancellation.py): while `hold` exists, every decoding
    step after a request's first waits, so a test can keep a request in the batch as long as it needs."""
    return tmp_path_factory.mktemp("input-faults-gate")


@pytest.fixture(scope="module")
def triton(engine, gate, tmp_path_factory):
    from dflash_trt.serving.cancellation import STEP_GATE_ENV
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    repo = render_repository(RepoConfig(engine, tmp_path_factory.mktemp("input-faults-repo"), max_tokens_limit=64,
                                        max_context_tokens=CONTEXT, num_threads=1, block_policy="fixed",
                                        max_batch_sequences=1, max_queue_size=1, canary_tokens=0))
    os.environ[STEP_GATE_ENV] = str(gate)
    try:
        server = serve_on_free_ports(repo, ready_timeout_s=600, admin_key=ADMIN_KEY,
                                     log_path=tmp_path_factory.mktemp("input-faults-log") / "server.log")
    finally:
        del os.environ[STEP_GATE_ENV]
    with server:
        yield server


def http(url: str, body=None, headers=None, method=None, timeout_s: float = 120.0) -> tuple[int, str]:
    """(status, body text) of one HTTP request; errors are answers too."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def generate(triton, body, stream=False) -> tuple[int, str]:
    route = "generate_stream" if stream else "generate"
    return http(f"{triton.config.http_url}/v2/models/ensemble/{route}", body)


def serves_normally(triton) -> bool:
    status, text = generate(triton, {"text_input": "still there?", "max_tokens": 2})
    return status == 200 and json.loads(text)["num_output_tokens"] == 2


# --- Triton: what our models see is refused with a 400 naming the input -----------------------------------------

WORDS_OVER = [f"w{i}" for i in range(MAX_WORDS + 1)]


@pytest.mark.parametrize("body, message", [
    # A missing required input next to an optional one: Triton 2.51 answered 200 with nothing.
    ({"text_input": "hi", "temperature": 0.5}, "missing required input 'max_tokens'"),
    ({"max_tokens": 4, "top_k": 3}, "missing required input 'text_input'"),
    ({}, "missing required input 'text_input'"),
    # A misspelt field became a request parameter that nothing read.
    ({"text_input": "hi", "max_tokens": 4, "temprature": 0.5}, "unknown field(s) 'temprature' (did you mean "
                                                                "'temperature'?)"),
    # Refused by size, before tokenizing.
    ({"text_input": "x" * (CONTEXT * 32 + 1), "max_tokens": 4}, f"text_input is {CONTEXT * 32 + 1} bytes; this "
                                                                   f"server accepts at most {CONTEXT * 32} bytes"),
    ({"text_input": "hi", "max_tokens": 4, "stop_words": WORDS_OVER}, f"stop_words has {MAX_WORDS + 1} entries"),
    ({"text_input": "hi", "max_tokens": 4, "bad_words": WORDS_OVER}, f"bad_words has {MAX_WORDS + 1} entries"),
    ({"text_input": "hi", "max_tokens": 4, "bad_words": ["b" * (MAX_WORD_BYTES + 1)]},
     f"bad_words[0] is {MAX_WORD_BYTES + 1} bytes"),
])
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "generate_stream"])
def test_bad_http_input_is_a_400_naming_it_and_the_server_keeps_serving(triton, body, message, stream):
    status, text = generate(triton, {**body, "stream": True} if stream else body, stream=stream)
    assert status == 400, text
    assert message in text
    assert serves_normally(triton)


def test_a_missing_required_input_is_named_on_grpc_too(triton):
    import tritonclient.grpc as grpcclient

    from dflash_trt.serving.client import grpc_inputs

    inputs = [t for t in grpc_inputs("hi", 4, temperature=0.5, stream=True) if t.name() != "max_tokens"]
    errors = []
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    done = threading.Event()
    client.start_stream(callback=lambda result, error: (errors.append(error), done.set()))
    try:
        client.async_stream_infer("ensemble", inputs)
        assert done.wait(timeout=120), "no answer on the stream"
    finally:
        client.stop_stream()
        client.close()
    assert errors[0] is not None and "missing required input 'max_tokens'" in str(errors[0])
    assert serves_normally(triton)


# --- Triton: what Triton itself decides before our models run (documented limits) -------------------------------

def test_triton_wraps_a_max_tokens_beyond_int32_before_any_model_sees_it(triton):
    status, text = generate(triton, {"text_input": "hi", "max_tokens": 2**32 + 8})
    assert status == 200 and json.loads(text)["num_output_tokens"] == 8  # the gateway refuses it instead


@pytest.mark.parametrize("body", [{"text_input": "hi", "max_tokens": "eight"},
                                  {"text_input": "hi", "max_tokens": 4, "temperature": "hot"},
                                  {"text_input": 5, "max_tokens": 4},
                                  {"text_input": "a\ud800", "max_tokens": 4}])  # a lone surrogate
def test_triton_answers_a_json_type_error_with_its_own_500(triton, body):
    status, text = generate(triton, body)
    assert status == 500 and "parse" in text
    assert serves_normally(triton)


@pytest.mark.parametrize("api", ["logging", "trace/setting"])
def test_tritons_admin_apis_need_the_admin_key(triton, api):
    from dflash_trt.serving.admin_apis import ADMIN_KEY_HEADER

    url = f"{triton.config.http_url}/v2/{api}"
    refused, text = http(url, {})
    assert refused == 403 and "restricted" in text.lower()
    assert http(url, {}, headers={ADMIN_KEY_HEADER: "guess"})[0] == 403
    assert http(url, {}, headers={ADMIN_KEY_HEADER: ADMIN_KEY})[0] == 200
    assert serves_normally(triton)


def test_shared_memory_registration_needs_the_admin_key_on_grpc(triton):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from dflash_trt.serving.admin_apis import GRPC_ADMIN_KEY_HEADER

    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="(?i)restricted|permission"):
            client.get_system_shared_memory_status()
        client.get_system_shared_memory_status(headers={GRPC_ADMIN_KEY_HEADER: ADMIN_KEY})
    finally:
        client.close()


# --- a full queue: Triton's 400, the gateway's 429 ----------------------------------------------------------------

def metric(triton, name: str, model: str) -> float:
    with urllib.request.urlopen(triton.config.metrics_url, timeout=30) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name + "{") and f'model="{model}"' in line)


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(GATE_POLL_S)


class FullQueue:
    """Holds the decoding steps and fills the model: one request in the batch (of one), one waiting for room in the
    model's execute (counted in flight), one in Triton's queue (of one), so the next request finds the queue full; on
    exit releases them and waits for their answers."""

    def __init__(self, triton, gate: Path):
        self.triton, self.gate, self.threads, self.answers = triton, gate, [], []

    def __enter__(self):
        (self.gate / "hold").touch()
        for held in (1, 2):
            self._send()
            wait_for(lambda: metric(self.triton, "dflash_requests_in_flight", "dflash") == held,
                     f"request {held} in the model")
        self._send()
        wait_for(lambda: metric(self.triton, "nv_inference_pending_request_count", "dflash") == 1,
                 "the third request in the queue")
        return self

    def _send(self) -> None:
        thread = threading.Thread(target=lambda: self.answers.append(
            generate(self.triton, {"text_input": "hold on", "max_tokens": 8})))
        thread.start()
        self.threads.append(thread)

    def __exit__(self, *exc):
        (self.gate / "hold").unlink()
        for thread in self.threads:
            thread.join(timeout=300)
        assert [status for status, _ in self.answers] == [200, 200, 200], self.answers


def test_a_full_queue_is_tritons_400_naming_the_queue(triton, gate):
    with FullQueue(triton, gate):
        status, text = generate(triton, {"text_input": "one too many", "max_tokens": 2})
    assert status == 400 and "Exceeds maximum queue size" in text
    assert serves_normally(triton)


# --- the OpenAI gateway in front: the strict front, with an API key ---------------------------------------------

@pytest.fixture(scope="module")
def gateway(triton, tmp_path_factory):
    """`dflash-trt openai` in a child process, its key from DFLASH_TRT_API_KEY; yields its base URL."""
    from dflash_trt.serving.server import free_ports

    port = free_ports(1)[0]
    log = tmp_path_factory.mktemp("input-faults-gateway") / "gateway.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "dflash_trt.cli", "openai", "--triton-grpc", triton.config.grpc_url,
             "--port", str(port), "--served-model-name", "m", "--ready-timeout", "120"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "DFLASH_TRT_API_KEY": API_KEY})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: process.poll() is not None or (_listening(port) and http(url + "/health")[0] == 200),
                 "the gateway to become healthy", timeout_s=180)
        if process.poll() is not None:
            pytest.fail(f"the gateway exited:\n{log.read_text()}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def completion(gateway, body=None, headers=None, raw=None) -> tuple[int, dict]:
    status, text = http(gateway + "/v1/completions", raw if raw is not None else {"model": "m", **(body or {})},
                        headers={**AUTH, **(headers or {})})
    return status, json.loads(text)


def gateway_serves_normally(gateway) -> bool:
    status, answer = completion(gateway, {"prompt": "still there?", "max_tokens": 2, "temperature": 0})
    return status == 200 and answer["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("case, headers, body, raw, status, code, message", [
    ("no key", {"Authorization": ""}, {"prompt": "hi"}, None, 401, "invalid_api_key", "didn't provide an API key"),
    ("wrong key", {"Authorization": "Bearer nope"}, {"prompt": "hi"}, None, 401, "invalid_api_key", "Incorrect"),
    ("text/plain", {"Content-Type": "text/plain"}, {"prompt": "hi"}, None, 415, "unsupported_media_type",
     "Content-Type must be application/json"),
    ("max_tokens beyond INT32", {}, {"prompt": "hi", "max_tokens": 2**32 + 8}, None, 400, None,
     "max_tokens is too large: 4294967304"),
    ("lone surrogate", {}, None, b'{"model": "m", "prompt": "a\\ud800"}', 400, None, "lone UTF-16 surrogate"),
    ("wrong type", {}, {"prompt": "hi", "max_tokens": "eight"}, None, 400, None, "max_tokens must be an integer"),
    ("unknown field", {}, {"prompt": "hi", "temprature": 1}, None, 400, None, "Unrecognized request argument"),
    ("huge prompt", {}, {"prompt": "x" * (CONTEXT * 32 + 1)}, None, 400, "context_length_exceeded",
     f"accepts at most {CONTEXT * 32} bytes"),
    ("8 MB body", {}, {"prompt": "word " * (8 * 2**20 // 5)}, None, 413, "request_too_large", "larger than"),
])
def test_the_gateway_refuses_in_openais_shape_and_keeps_serving(gateway, case, headers, body, raw, status, code,
                                                                 message):
    got, answer = completion(gateway, body, headers, raw)
    assert got == status, answer
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert message in answer["error"]["message"]
    if code:
        assert answer["error"]["code"] == code
    assert gateway_serves_normally(gateway)


def test_the_gateway_maps_a_full_queue_to_429(gateway, triton, gate):
    with FullQueue(triton, gate):
        status, answer = completion(gateway, {"prompt": "one too many", "max_tokens": 2})
    assert status == 429 and answer["error"]["code"] == "queue_full"
    assert gateway_serves_normally(gateway)
