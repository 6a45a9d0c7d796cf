"""End to end: NVIDIA's `tensorrt_llm` contract (its LLM-API model) on the real tritonserver, rendered as
NVIDIA ships it (not decoupled): NVIDIA's llmapi client flow over gRPC ModelInfer, HTTP generate, cancel by
`stop` and by request cancellation, the optional outputs, and the refusals. The answers must be the
ensemble's, token for token (the same dflash model and tokenizer serve both)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from llmapi_client import LlmApiClient, describe, is_cancelled, prompt_arrays, stop_arrays, text_of
from triton_waits import metric_total, steps_until_idle, wait_for

from dflash_trt.serving.client import generate

pytestmark = pytest.mark.slow

PROMPT = "Born in north-east France, Soyer trained as a"
MAX_TOKENS = 12
CANCELLED_LOG = "tensorrt_llm: request cancelled"


@pytest.fixture
def llmapi(triton):
    client = LlmApiClient(triton.config.grpc_url)
    yield client
    client.close()


def ensemble_text(triton, max_tokens: int = MAX_TOKENS, **params) -> str:
    return generate(triton.config.http_url, PROMPT, max_tokens, **params)["text_output"]


def test_llmapi_client_flow_answers_as_the_ensemble(triton, llmapi):
    """llmapi_client.py's defaults: the prompt comes back in front of the answer (NVIDIA's model passes
    exclude_input_from_output = false), as the ensemble's non-streamed answer without exclude_input_in_output."""
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS), request_id="1")
    assert text_of(llmapi.next()) == ensemble_text(triton)
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS, sampling_param_exclude_input_from_output=np.array([True])), "2")
    assert text_of(llmapi.next()) == ensemble_text(triton, exclude_input_in_output=True)


def test_sampling_parameters_reach_the_generation(triton, llmapi):
    params = {"sampling_param_temperature": np.array([0.9], dtype=np.float32),
              "sampling_param_top_k": np.array([20], dtype=np.int32),
              "sampling_param_seed": np.array([7], dtype=np.uint64),
              "sampling_param_stop": np.array([b"no such words"], dtype=object),
              "sampling_param_exclude_input_from_output": np.array([True])}
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS, **params), request_id="s")
    expected = ensemble_text(triton, temperature=0.9, top_k=20, seed=7, stop_words=["no such words"],
                             exclude_input_in_output=True)
    assert text_of(llmapi.next()) == expected
    assert expected != ensemble_text(triton, exclude_input_in_output=True)  # sampling changed the answer


def test_http_generate_takes_the_llmapi_names(triton):
    body = {"text_input": PROMPT, "sampling_param_max_tokens": MAX_TOKENS,
            "sampling_param_exclude_input_from_output": True, "return_finish_reason": True}
    request = urllib.request.Request(f"{triton.config.http_url}/v2/models/tensorrt_llm/generate",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
    assert answer["text_output"] == ensemble_text(triton, exclude_input_in_output=True)
    assert answer["finish_reason"] in ("length", "stop")


def test_optional_outputs_finish_reason_and_perf_metrics(triton, llmapi):
    extra = {"return_finish_reason": np.array([True]), "return_stop_reason": np.array([True]),
             "sampling_param_return_perf_metrics": np.array([True])}
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS, **extra), request_id="m")
    result = llmapi.next()
    text_of(result)
    ensemble = generate(triton.config.http_url, PROMPT, MAX_TOKENS)
    assert result.as_numpy("finish_reason")[0].decode() == ensemble["finish_reason"]
    assert result.as_numpy("stop_reason")[0].decode() == "None"
    drafted = int(result.as_numpy("total_draft_tokens")[0])
    accepted = int(result.as_numpy("total_accepted_draft_tokens")[0])
    assert (drafted, accepted) == (ensemble["total_draft_tokens"], ensemble["total_accepted_draft_tokens"])
    assert drafted > 0 and result.as_numpy("acceptance_rate")[0] == pytest.approx(accepted / drafted)
    times = [int(result.as_numpy(name)[0]) for name in
             ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")]
    assert 0 < times[0] <= times[1] <= times[2] <= times[3]
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS), request_id="plain")
    plain = llmapi.next()
    assert plain.as_numpy("finish_reason") is None and plain.as_numpy("acceptance_rate") is None  # not asked for


def test_nvidia_cancel_test_flow(triton, llmapi):
    """tests/test_llmapi_cancel.py: a stop for an id nobody runs is answered CANCELLED, a stop after the
    answer too, and the server answers the same request the same way afterwards."""
    llmapi.send(stop_arrays(), request_id="1")
    assert is_cancelled(llmapi.next())
    call = llmapi.send(prompt_arrays("The current time is", 20), request_id="1")
    first = text_of(llmapi.next())
    call.cancel()
    llmapi.send(stop_arrays(), request_id="1")
    assert is_cancelled(llmapi.next())
    llmapi.send(prompt_arrays("The current time is", 20), request_id="2")
    assert text_of(llmapi.next()) == first


def _held_request(triton, llmapi, request_id: str):
    """A long request whose decoding is held after its first step (the step gate): it is running."""
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    before = metric_total(triton, "dflash_generated_tokens_total")
    call = llmapi.send(prompt_arrays("a long answer please", 200), request_id=request_id)
    wait_for(lambda: metric_total(triton, "dflash_generated_tokens_total") > before, "the first step")
    return call


def test_a_stop_request_cancels_the_running_request_within_one_step(triton, llmapi, step_gate):
    logged = triton.log.count(CANCELLED_LOG)
    with step_gate.holding():
        _held_request(triton, llmapi, "long-1")
        llmapi.send(stop_arrays(), request_id="long-1")
        results = [llmapi.next(), llmapi.next()]  # the stop's answer and the cancelled request's
        assert all(is_cancelled(r) for r in results), [describe(r) for r in results]
        assert steps_until_idle(triton, step_gate) <= 1
    wait_for(lambda: triton.log.count(CANCELLED_LOG) == logged + 1, "the cancellation logged")
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS), request_id="after")
    assert text_of(llmapi.next()) == ensemble_text(triton)


def test_cancelling_the_call_stops_its_generation_within_one_step(triton, llmapi, step_gate):
    logged = triton.log.count(CANCELLED_LOG)
    with step_gate.holding():
        call = _held_request(triton, llmapi, "long-2")
        call.cancel()
        assert is_cancelled(llmapi.next())
        assert steps_until_idle(triton, step_gate) <= 1
    wait_for(lambda: triton.log.count(CANCELLED_LOG) == logged + 1, "the cancellation logged")


@pytest.mark.parametrize("extra, message", [
    ({"streaming": np.array([True])}, "--tensorrt-llm-decoupled"),
    ({"sampling_param_best_of": np.array([2], dtype=np.int32)}, "sampling_param_best_of"),
    ({"return_cumulative_logprob": np.array([True])}, "return_cumulative_logprob"),
    ({"sampling_param_top_p": np.array([0.0], dtype=np.float32)}, "sampling_param_top_p must be in (0, 1]"),
], ids=["streaming", "best_of", "logprob", "top_p"])
def test_what_is_not_served_is_refused_naming_the_input(triton, llmapi, extra, message):
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS, **extra), request_id="bad")
    error = llmapi.next()
    assert isinstance(error, Exception) and message in str(error)


def test_max_tokens_beyond_the_limit_is_refused_naming_the_input(triton):
    body = {"text_input": PROMPT, "sampling_param_max_tokens": 100000}
    request = urllib.request.Request(f"{triton.config.http_url}/v2/models/tensorrt_llm/generate",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=300)
    assert "sampling_param_max_tokens must be in [1, 256]" in raised.value.read().decode()


def test_an_undeclared_input_is_refused_by_triton(triton, llmapi):
    llmapi.send(prompt_arrays(PROMPT, MAX_TOKENS, lora_id=np.array([1], dtype=np.uint64)), request_id="lora")
    assert "unexpected inference input 'lora_id'" in str(llmapi.next())


def test_http_infer_serves_the_model_as_nvidia_ships_it(triton):
    """Not decoupled, the model also answers Triton's HTTP /infer (NVIDIA's end_to_end_test.py --protocol http)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(triton.config.http_url.removeprefix("http://"))
    try:
        inputs = []
        for name, array in prompt_arrays(PROMPT, MAX_TOKENS).items():
            tensor = httpclient.InferInput(name, list(array.shape), "BYTES" if array.dtype.kind == "O" else "INT32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer("tensorrt_llm", inputs, outputs=[httpclient.InferRequestedOutput("text_output")])
    finally:
        client.close()
    assert result.as_numpy("text_output")[0].decode() == ensemble_text(triton)


def test_stop_reason_is_the_stop_word_that_ended_the_answer(triton, llmapi):
    text = ensemble_text(triton, 40, exclude_input_in_output=True)
    words = text.split()
    stop = " " + words[len(words) // 2]
    extra = {"sampling_param_stop": np.array([b"never-seen", stop.encode()], dtype=object),
             "sampling_param_exclude_input_from_output": np.array([True]), "return_stop_reason": np.array([True]),
             "return_finish_reason": np.array([True])}
    llmapi.send(prompt_arrays(PROMPT, 40, **extra), request_id="stop-word")
    result = llmapi.next()
    assert text_of(result) == ensemble_text(triton, 40, exclude_input_in_output=True, stop_words=[stop])
    assert result.as_numpy("finish_reason")[0] == b"stop" and result.as_numpy("stop_reason")[0] == stop.encode()
