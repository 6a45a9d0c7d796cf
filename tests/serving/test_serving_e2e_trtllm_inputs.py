"""End to end: a client written for TensorRT-LLM's ensemble, sending its optional inputs, works unchanged.

Neutral values (empty bad_words, beam_width 1, return_log_probs false, ...) give the very answer of a
request without them; a value that asks for something unsupported is refused in one clear message and
the server stays healthy. The logits controls (bad_words, min_tokens, penalties) are served: the answer is
plain decoding's with the same settings.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_waits import is_healthy, post

from dflash_trt.decoding.api import generate as decode
from dflash_trt.serving.client import RequestFailed, generate
from dflash_trt.serving.detokenize import decode as detokenize
from dflash_trt.serving.generation import sampling_params
from dflash_trt.serving.requests import GenerationRequest
from dflash_trt.serving.runtime import open_runtime

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
# Optional inputs a TensorRT-LLM client may send with their features off (dtype, value), with sampling set to greedy.
TRTLLM_CLIENT_INPUTS = {
    "bad_words": (object, [b""]), "stop_words": (object, [b""]), "pad_id": (np.int32, [2]),
    "end_id": (np.int32, [2]), "beam_width": (np.int32, [1]), "num_return_sequences": (np.int32, [1]),
    "temperature": (np.float32, [1.0]), "top_k": (np.int32, [1]), "top_p": (np.float32, [1.0]),
    "length_penalty": (np.float32, [1.0]), "repetition_penalty": (np.float32, [1.0]),
    "presence_penalty": (np.float32, [0.0]), "frequency_penalty": (np.float32, [0.0]),
    "min_tokens": (np.int32, [1]), "seed": (np.uint64, [7]), "return_log_probs": (bool, [False]),
    "return_context_logits": (bool, [False]), "return_generation_logits": (bool, [False]),
    "return_num_output_tokens": (bool, [True]), "embedding_bias_words": (object, [b""]),
    "embedding_bias_weights": (np.float32, []), "stream": (bool, [False]),
    "exclude_input_in_output": (bool, [True]),
}
TRITON_TYPES = {object: "BYTES", np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64", bool: "BOOL"}


def trtllm_request(max_tokens: int, **overrides) -> list:
    """The ensemble's inputs as TensorRT-LLM's client builds them: a leading batch dimension of 1."""
    values = {"text_input": (object, [PROMPT.encode()]), "max_tokens": (np.int32, [max_tokens]),
              **TRTLLM_CLIENT_INPUTS, **overrides}
    inputs = []
    for name, (dtype, value) in values.items():
        array = np.array([value], dtype=dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), TRITON_TYPES[dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def infer(triton, inputs) -> dict:
    """One request on a gRPC stream (the ensemble is decoupled); the last response's outputs."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.config.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        outputs = {}
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                raise RequestFailed(str(error))
            for output in result.get_response().outputs:
                value = result.as_numpy(output.name).reshape(-1)[0]
                outputs[output.name] = value.decode() if isinstance(value, bytes) else value.item()
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return outputs
    finally:
        client.stop_stream()
        client.close()


def test_a_tensorrt_llm_client_gets_the_answer_of_a_plain_request(triton):
    plain = generate(triton.config.http_url, PROMPT, 12, end_id=2, exclude_input_in_output=True)
    answer = infer(triton, trtllm_request(12))
    assert answer["text_output"] == plain["text_output"]
    assert answer["num_output_tokens"] == plain["num_output_tokens"] > 0


def test_the_http_generate_body_of_tensorrt_llms_readme_works(triton):
    answer = post(triton, {"text_input": PROMPT, "max_tokens": 6, "bad_words": "", "stop_words": "",
                           "beam_width": 1, "return_log_probs": False, "pad_id": 2})
    assert answer["num_output_tokens"] == 6
    assert answer["text_output"] == generate(triton.config.http_url, PROMPT, 6)["text_output"]


@pytest.mark.parametrize("name, value, message", [
    ("beam_width", (np.int32, [4]), "input 'beam_width' = 4 is not supported by DFlash serving; send 1"),
    ("embedding_bias_words", (object, [b"Paris"]),
     "input 'embedding_bias_words' = 'Paris' is not supported by DFlash serving"),
    ("return_log_probs", (bool, [True]), "input 'return_log_probs' = True is not supported"),
])
def test_an_unsupported_value_is_refused_in_one_clear_message(triton, name, value, message):
    with pytest.raises(RequestFailed) as failure:
        infer(triton, trtllm_request(8, **{name: value}))
    assert message in str(failure.value)
    assert str(failure.value).count("not supported by DFlash serving") == 1
    assert is_healthy(triton)


def test_http_refuses_an_unsupported_value_with_400(triton):
    with pytest.raises(RequestFailed) as failure:
        post(triton, {"text_input": PROMPT, "max_tokens": 8, "beam_width": 2})
    assert failure.value.status == 400
    assert "input 'beam_width' = 2 is not supported by DFlash serving; send 1" in str(failure.value)
    assert is_healthy(triton)


def test_bad_words_min_tokens_and_a_penalty_give_plain_decodings_tokens(triton, tiny_engine):
    # The served pipeline (DFlash, block 8) against plain decoding of the same engine in this process.
    runtime = open_runtime(tiny_engine, num_threads=1, block_size=1)
    tokenizer, prompt = runtime.tokenizer, runtime.tokenizer.encode(PROMPT)  # preprocessing: no chat template

    def plain_decoding(request, end_ids):
        result = decode(runtime.target, None, [prompt], sampling_params(request, end_ids, tokenizer), 1)[0]
        return result.token_ids[:-1] if result.finish_reason == "stop" else result.token_ids  # end id kept out

    plain = plain_decoding(GenerationRequest(PROMPT, 16), ())
    end_id, word = plain[1], detokenize(tokenizer, plain[3:5])  # an early end, a word of the plain answer
    banned = plain_decoding(GenerationRequest(PROMPT, 16, bad_words=(word,)), ())
    held = GenerationRequest(PROMPT, 16, end_id=end_id, min_tokens=8, repetition_penalty=1.3)
    longer = plain_decoding(held, (end_id,))
    assert banned != plain and len(longer) >= 8 > len(plain_decoding(GenerationRequest(PROMPT, 16, end_id=end_id),
                                                                        (end_id,)))
    assert longer != plain_decoding(GenerationRequest(PROMPT, 16, end_id=end_id, min_tokens=8), (end_id,))
    for expected, inputs in ((banned, dict(bad_words=(object, [word.encode()]))),
                             (longer, dict(end_id=(np.int32, [end_id]), min_tokens=(np.int32, [8]),
                                           repetition_penalty=(np.float32, [1.3])))):
        answer = infer(triton, trtllm_request(16, end_id=inputs.pop("end_id", (np.int32, [-1])), **inputs))
        assert answer["text_output"] == detokenize(tokenizer, expected)
        assert answer["num_output_tokens"] == len(expected)


@pytest.mark.parametrize("body, message", [
    ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0, got 0"),
    ({"min_tokens": -1}, "min_tokens must be >= 0, got -1"),
])
def test_a_bad_logits_control_is_refused_with_400_and_the_server_stays_healthy(triton, body, message):
    with pytest.raises(RequestFailed) as failure:
        post(triton, {"text_input": PROMPT, "max_tokens": 8, **body})
    assert failure.value.status == 400 and message in str(failure.value) and "\n" not in str(failure.value)
    assert is_healthy(triton)
