"""The `tensorrt_llm` contract without a server: request validation, what the dflash model is asked, how its
chunks become answers, and how the repository renders the model."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.serving import llmapi
from dflash_trt.serving.detokenize import ChunkWindow, decode
from dflash_trt.serving.requests import InvalidRequest, RequestLimits

LIMITS = RequestLimits(max_tokens=100, max_context_tokens=512)


def arrays(**values) -> dict[str, np.ndarray]:
    out = {"text_input": np.array([b"Hello there"], dtype=object)}
    for name, value in values.items():
        out[name] = value if isinstance(value, np.ndarray) else np.array([value])
    return out


def test_defaults_are_the_llm_apis():
    request = llmapi.parse_llmapi_request(arrays(), LIMITS, decoupled=False)
    gen = request.generation
    assert (gen.text, gen.max_tokens, gen.temperature, gen.exclude_input_in_output) == ("Hello there", 32, 0.0, False)
    assert not (request.streaming or request.return_perf_metrics or request.return_finish_reason)
    small = RequestLimits(max_tokens=8, max_context_tokens=512)
    assert llmapi.parse_llmapi_request(arrays(), small, decoupled=False).generation.max_tokens == 8


def test_sampling_parameters_map_to_the_generation():
    request = llmapi.parse_llmapi_request(arrays(
        sampling_param_max_tokens=np.array([5], dtype=np.int32),
        sampling_param_temperature=np.array([0.7], dtype=np.float32),
        sampling_param_top_k=np.array([3], dtype=np.int32), sampling_param_top_p=np.array([0.9], dtype=np.float32),
        sampling_param_seed=np.array([11], dtype=np.uint64),
        sampling_param_stop=np.array([b"END", b""], dtype=object),
        sampling_param_presence_penalty=np.array([0.5], dtype=np.float32),
        sampling_param_frequency_penalty=np.array([0.25], dtype=np.float32),
        sampling_param_exclude_input_from_output=True, streaming=True), LIMITS, decoupled=True)
    gen = request.generation
    assert (gen.max_tokens, gen.top_k, gen.seed, gen.stop_words) == (5, 3, 11, ("END",))
    assert (gen.temperature, gen.top_p) == pytest.approx((0.7, 0.9))
    assert (gen.presence_penalty, gen.frequency_penalty, gen.exclude_input_in_output) == (0.5, 0.25, True)
    sent = llmapi.dflash_inputs(request, [1, 2, 3])
    assert sent["input_ids"].tolist() == [1, 2, 3] and sent["stream"].tolist() == [True]
    assert sent["stop_words"].tolist() == [b"END"] and sent["seed"].tolist() == [11]
    plain = llmapi.dflash_inputs(llmapi.parse_llmapi_request(arrays(), LIMITS, False), [1])
    assert plain["stream"].tolist() == [True] and "seed" not in plain and "stop_words" not in plain


@pytest.mark.parametrize("values, message", [
    ({"sampling_param_max_tokens": np.array([0], dtype=np.int32)}, "sampling_param_max_tokens must be in [1, 100]"),
    ({"sampling_param_temperature": np.array([-1.0], dtype=np.float32)}, "sampling_param_temperature must be >= 0"),
    ({"streaming": True}, "input 'streaming' = true needs the decoupled tensorrt_llm model"),
    ({"sampling_param_best_of": np.array([2], dtype=np.int32)}, "input 'sampling_param_best_of' = 2"),
    ({"return_cumulative_logprob": True}, "input 'return_cumulative_logprob' = true"),
    ({"text_input": np.array([[b"a"], [b"b"]], dtype=object)}, "input 'text_input' must hold one prompt"),
    ({"text_input": np.array([b"  "], dtype=object)}, "text_input is empty"),
])
def test_refusals_name_the_input(values, message):
    with pytest.raises(InvalidRequest) as raised:
        llmapi.parse_llmapi_request(arrays(**values), LIMITS, decoupled=False)
    assert message in str(raised.value)


def test_a_stop_request_is_recognised():
    assert llmapi.is_stop_request({"stop": np.array([True])})
    assert not llmapi.is_stop_request({"stop": np.array([False])}) and not llmapi.is_stop_request({})


def chunk(window, num_context, finish=b"", drafted=14, accepted=5, stop_reason=b""):
    return {"stop_reason": np.array([stop_reason], dtype=object), "output_ids": np.array(window, dtype=np.int32),
            "num_context_tokens": np.array([num_context], np.int32), "num_cached_tokens": np.array([0], np.int32),
            "num_output_tokens": np.array([3], np.int32), "total_draft_tokens": np.array([drafted], np.int32),
            "total_accepted_draft_tokens": np.array([accepted], np.int32), "num_verify_steps": np.array([2], np.int32),
            "acceptance_rate": np.array([accepted / drafted], np.float32),
            "finish_reason": np.array([finish], dtype=object), "generation_id": np.array([b"0" * 32], dtype=object)}


def chunks_of(ids: list[int], sizes: list[int]):
    """The dflash model's streamed chunks for `ids`, released `sizes` tokens at a time."""
    window, start = ChunkWindow(), 0
    for n, size in enumerate(sizes):
        ids_, num_context = window.add(ids[start:start + size])
        start += size
        yield chunk(ids_, num_context, b"length" if n == len(sizes) - 1 else b"")


def test_a_streamed_answer_is_the_ensembles_pieces(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(" tides rise 🌊 twice a day", add_special_tokens=False)
    request = llmapi.parse_llmapi_request(arrays(streaming=True), LIMITS, decoupled=True)
    answer = llmapi.Answer(request, smollm2_tokenizer, [1, 2])
    pieces = [answer.push(c)["text_output"][0].decode() for c in chunks_of(ids, [2, 3, len(ids) - 5])]
    assert "".join(pieces) == decode(smollm2_tokenizer, ids) and answer.finished


@pytest.mark.parametrize("exclude", [False, True])
def test_a_whole_answer_goes_out_once_with_the_prompt_unless_excluded(smollm2_tokenizer, exclude):
    prompt = smollm2_tokenizer.encode("Tides:", add_special_tokens=False)
    ids = smollm2_tokenizer.encode(" twice a day", add_special_tokens=False)
    request = llmapi.parse_llmapi_request(arrays(sampling_param_exclude_input_from_output=exclude), LIMITS, False)
    answer = llmapi.Answer(request, smollm2_tokenizer, prompt)
    replies = [answer.push(c) for c in chunks_of(ids, [1, len(ids) - 1])]
    assert replies[0] is None
    expected = decode(smollm2_tokenizer, ids if exclude else prompt + ids)
    assert replies[1]["text_output"].tolist() == [expected.encode()]
    assert set(replies[1]) == {"text_output"}  # nothing else unless asked for


def test_finish_reason_and_perf_metrics_when_asked_for(smollm2_tokenizer):
    request = llmapi.parse_llmapi_request(arrays(streaming=True, return_finish_reason=True, return_stop_reason=True,
                                                 sampling_param_return_perf_metrics=True), LIMITS, decoupled=True)
    answer = llmapi.Answer(request, smollm2_tokenizer, [1])
    answer.scheduled()
    first, last = [answer.push(c) for c in chunks_of([300, 301, 302], [1, 2])]
    assert first["finish_reason"].tolist() == [b"None"] and last["finish_reason"].tolist() == [b"length"]
    assert last["stop_reason"].tolist() == [b"None"]
    assert (last["total_draft_tokens"].tolist(), last["total_accepted_draft_tokens"].tolist()) == ([14], [5])
    assert last["acceptance_rate"][0] == pytest.approx(5 / 14)
    assert set(last) == {"text_output", *llmapi.OUTPUTS}
    times = [int(last[name][0]) for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                             "last_token_time_ns")]
    assert times == sorted(times) and times[0] > 0


def test_the_repository_renders_nvidias_tensors_not_decoupled_unless_asked(tiny_engine, tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from dflash_trt.serving.repo import RepoConfig, render_repository

    def config(decoupled: bool):
        out = tmp_path / str(decoupled)
        render_repository(RepoConfig(tiny_engine, out, tensorrt_llm_decoupled=decoupled, max_batch_sequences=4,
                                     max_queue_size=10))
        assert (out / "tensorrt_llm" / "1" / "model.py").is_file()
        return text_format.Parse((out / "tensorrt_llm" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())

    shipped, streaming = config(False), config(True)
    assert shipped.name == "tensorrt_llm" and shipped.max_batch_size == 0
    assert not shipped.model_transaction_policy.decoupled and streaming.model_transaction_policy.decoupled
    type_name = model_config_pb2.DataType.Name
    assert {t.name: type_name(t.data_type) for t in shipped.input} == llmapi.INPUTS
    assert {t.name: type_name(t.data_type) for t in shipped.output} == llmapi.OUTPUTS
    assert [t.name for t in shipped.input if not t.optional] == ["text_input"]
    assert shipped.parameters["max_in_flight"].string_value == "14"  # 1 instance x 4 sequences + 10 queued


def test_stop_reason_names_the_stop_word(smollm2_tokenizer):
    request = llmapi.parse_llmapi_request(arrays(return_stop_reason=True), LIMITS, decoupled=False)
    answer = llmapi.Answer(request, smollm2_tokenizer, [1])
    reply = answer.push(chunk([300], 0, b"stop", stop_reason=b"END"))
    assert reply["stop_reason"].tolist() == [b"END"]
