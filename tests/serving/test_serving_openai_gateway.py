"""The OpenAI-compatible gateway (`dflash-trt openai`) on the real tritonserver, driven by the `openai` package.

Answers are compared with Triton's own /generate for the same prompt text, so the gateway is checked
to add nothing and lose nothing; errors, stop strings, streaming and client disconnects are covered.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from triton_waits import metric_total, steps_until_idle, wait_for

pytestmark = pytest.mark.slow

MODEL = "tiny-dflash"
PROMPT = "Write a short poem about the sea, with émojis 🌊 and 日本語."
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def gateway_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gateway") / "gateway.log"


@pytest.fixture(scope="module")
def gateway(triton, gateway_log):
    """`dflash-trt openai` in a child process in front of the session's Triton; yields its /v1 URL."""
    from dflash_trt.serving.server import free_ports

    port = free_ports(1)[0]
    log = gateway_log
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "dflash_trt.cli", "openai", "--triton-grpc", triton.config.grpc_url,
             "--port", str(port), "--served-model-name", MODEL, "--ready-timeout", "60"],
            stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", process, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=15)


def _wait_healthy(url: str, process, log, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the gateway exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"the gateway did not become healthy:\n{log.read_text()}")


@pytest.fixture(scope="module")
def client(gateway):
    import openai

    return openai.OpenAI(base_url=gateway, api_key="unused", max_retries=0, timeout=120)


def triton_generate(triton, text: str, max_tokens: int, **params) -> dict:
    """Triton's own answer (HTTP /generate of the ensemble), the reference for the gateway's."""
    body = {"text_input": text, "max_tokens": max_tokens, "temperature": 0.0, "exclude_input_in_output": True,
            **params}
    request = urllib.request.Request(triton.config.http_url + "/v2/models/ensemble/generate",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_completion_equals_tritons_answer_with_usage_and_dflash_figures(client, triton, smollm2_tokenizer):
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    reference = triton_generate(triton, PROMPT, 16)
    assert answer.choices[0].text == reference["text_output"]
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens == len(smollm2_tokenizer.encode(PROMPT))
    assert answer.usage.completion_tokens == 16
    dflash = answer.model_extra["dflash"]
    # block 8 pinned, 15 verify steps of which a step with r tokens left verifies at most r drafts
    assert dflash["num_draft_tokens"] == sum(min(7, left) for left in range(1, 16)) == reference["total_draft_tokens"]
    assert dflash["num_accepted_draft_tokens"] == reference["total_accepted_draft_tokens"]
    # tau over the verify steps the server counted (their drafts vary: the last steps are cut short)
    assert dflash["num_verify_steps"] == reference["num_verify_steps"] == 15
    assert dflash["tau"] == round(1 + reference["total_accepted_draft_tokens"] / 15, 4)


def test_chat_completion_applies_the_targets_chat_template(client, triton, smollm2_tokenizer):
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    templated = smollm2_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == triton_generate(triton, templated, 12)["text_output"]
    assert answer.usage.prompt_tokens == len(smollm2_tokenizer.encode(templated))


def test_streamed_completion_adds_up_to_the_same_text(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].model_extra["dflash"] == whole.model_extra["dflash"]


def test_streamed_chat_opens_with_the_role_and_adds_up_to_the_same_message(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage is None
    assert {c.id for c in chunks} == {chunks[0].id}


def test_a_stop_string_ends_the_text_before_it(client):
    text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    start = text.index(" ", 8)  # a word start well inside the answer: a token boundary for this tokenizer
    stop = text[start:start + 4]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "@@"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[:text.index(stop)]
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == stopped.choices[0].text


def test_bad_words_and_a_penalty_change_the_answer_as_on_tritons_generate(client, triton, smollm2_tokenizer):
    """vLLM's bad_words and OpenAI's presence_penalty reach the ensemble as its bad_words and presence_penalty."""
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    word = smollm2_tokenizer.decode(smollm2_tokenizer.encode(plain)[3:5])  # a word of the plain answer
    controlled = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                           presence_penalty=-1.0, extra_body={"bad_words": [word]})
    reference = triton_generate(triton, PROMPT, 16, bad_words=[word], presence_penalty=-1.0)
    assert controlled.choices[0].text != plain
    assert controlled.choices[0].text == reference["text_output"]
    assert controlled.usage.completion_tokens == reference["num_output_tokens"]


def test_seeded_sampling_repeats_and_depends_on_the_seed(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9,
                                         seed=seed).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_unknown_model_is_a_404(client):
    import openai

    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=4)
    assert error.value.code == "model_not_found"


@pytest.mark.parametrize("params, param", [
    ({"max_tokens": 100_000}, "max_tokens"),
    ({"temperature": 3.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"n": 2}, "n"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
])
def test_bad_parameters_are_400s_that_name_the_parameter(client, params, param):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, **params)
    assert error.value.param == param
    assert error.value.body["type"] == "invalid_request_error"


def test_bad_json_and_unknown_routes_get_openai_error_bodies(gateway):
    import httpx

    bad = httpx.post(gateway + "/chat/completions", content=b'{"model": ', headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.get(gateway + "/engines")
    assert missing.status_code == 404 and "error" in missing.json()


def wait_until_idle(triton) -> None:
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")


LONG = 256  # the repository's max_tokens limit: far more than a cancelled request may generate


def cancellations_logged(log: Path) -> int:
    from dflash_trt.gateway.app import CANCELLED_LOG

    return log.read_text().count(CANCELLED_LOG)


def held_after_its_first_step(triton, tokens_before: float) -> None:
    """The request's prefill step is done and its generation waits at the held gate."""
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 1
             and metric_total(triton, "dflash_generated_tokens_total") > tokens_before, "the first step")


def test_closing_a_stream_stops_the_generation_within_one_step(gateway, gateway_log, triton, step_gate):
    """Decoding waits at the gate after the first step, so the count below does not depend on speed:
    once the gateway saw the disconnect, at most the one step that carries the cancellation to the
    postprocessing model (Triton tells the running dflash step nothing) is computed."""
    import httpx

    wait_until_idle(triton)
    cancelled = cancellations_logged(gateway_log)
    with step_gate.holding():
        tokens = metric_total(triton, "dflash_generated_tokens_total")
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": LONG, "temperature": 0, "stream": True}
        with httpx.stream("POST", gateway + "/completions", json=body, timeout=60) as response:
            assert next(line for line in response.iter_lines() if line.startswith("data:"))
            held_after_its_first_step(triton, tokens)
        wait_for(lambda: cancellations_logged(gateway_log) > cancelled, "the gateway to cancel the generation")
        assert steps_until_idle(triton, step_gate) <= 1


def test_a_non_streaming_client_that_gives_up_stops_the_generation_within_one_step(gateway, gateway_log, triton,
                                                                                   step_gate):
    """A client waiting for a whole answer closes its connection while no token reaches the gateway
    (decoding is held): the gateway must notice the disconnect itself, not at the next piece."""
    wait_until_idle(triton)
    cancelled = cancellations_logged(gateway_log)
    port = int(gateway.rsplit(":", 1)[1].split("/")[0])
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": LONG, "temperature": 0}).encode()
    with step_gate.holding():
        tokens = metric_total(triton, "dflash_generated_tokens_total")
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            held_after_its_first_step(triton, tokens)
        wait_for(lambda: cancellations_logged(gateway_log) > cancelled, "the gateway to cancel the generation")
        assert steps_until_idle(triton, step_gate) <= 1


def test_serve_with_openai_port_runs_the_gateway_beside_triton_and_stops_both(tiny_engine, client, tmp_path):
    """`make serve OPENAI_PORT=...` runs `dflash-trt serve --openai-port` (the Helm chart's openai port), here on
    a repository that applies the chat template itself, as `make demo` renders it: a one-message chat gets the
    same answer as from the gateway that templates it, raw completions are refused."""
    import signal

    import openai

    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import free_ports

    repo = render_repository(RepoConfig(tiny_engine, tmp_path / "repo", chat_template="model",
                                        max_tokens_limit=256, max_context_tokens=512, num_threads=1))
    http, grpc, metrics, port = free_ports(4)
    log = tmp_path / "serve.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "dflash_trt.cli", "serve", "--repo", str(repo), "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--openai-port", str(port), "--quiet"],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", process, log, timeout_s=300)
        templating = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        name = templating.models.list().data[0].id
        user_only = MESSAGES[1:]
        answer = templating.chat.completions.create(model=name, messages=user_only, max_tokens=8, temperature=0)
        reference = client.chat.completions.create(model=MODEL, messages=user_only, max_tokens=8, temperature=0)
        assert answer.choices[0].message.content == reference.choices[0].message.content
        assert answer.usage == reference.usage
        with pytest.raises(openai.BadRequestError, match="single user message"):
            templating.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4)
        with pytest.raises(openai.BadRequestError, match="chat/completions"):
            templating.completions.create(model=name, prompt=PROMPT, max_tokens=4)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, log.read_text()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
