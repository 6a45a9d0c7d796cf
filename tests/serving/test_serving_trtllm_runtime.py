"""The trtllm runtime's request/response mapping, against a stand-in `tensorrt_llm` module
(TensorRT-LLM cannot be installed here); the stand-in mimics the 1.3 LLM API surface it uses."""

from __future__ import annotations

import asyncio
import sys
import types
from types import SimpleNamespace

import pytest

from dflash_trt.serving.generation import Stats, chunks
from dflash_trt.serving.requests import GenerationRequest
from dflash_trt.serving.trtllm_runtime import TrtllmRuntime, sampling_kwargs


class FakeRequestOutput:
    """Async-iterable like tensorrt_llm's RequestOutput in streaming mode; records abort()."""

    def __init__(self, script, llm):
        self.script, self.llm = script, llm
        self.aborted = False

    def abort(self):
        self.aborted = True
        self.llm.aborted.append(self)

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        drafted = accepted = 0
        for i, (tokens, step_drafts, step_accepted) in enumerate(self.script):
            if self.aborted:
                return
            drafted, accepted = drafted + step_drafts, accepted + step_accepted
            finished = i == len(self.script) - 1
            spec = SimpleNamespace(total_draft_tokens=drafted, total_accepted_draft_tokens=accepted)
            completion = SimpleNamespace(token_ids_diff=tokens, finish_reason="length" if finished else None,
                                         request_perf_metrics=SimpleNamespace(speculative_decoding=spec))
            yield SimpleNamespace(outputs=[completion], finished=finished)
            await asyncio.sleep(0.01)


@pytest.fixture
def trtllm(monkeypatch):
    """A stand-in tensorrt_llm module: LLM records its options and the requests it gets."""
    module = types.ModuleType("tensorrt_llm")

    class LLM:
        script = [([7], 0, 0), ([8, 9, 10], 7, 2), ([11], 7, 0), ([12, 13], 7, 1)]

        def __init__(self, **options):
            self.options, self.calls, self.aborted, self.is_shut_down = options, [], [], False
            module.instances.append(self)

        def generate_async(self, inputs, sampling_params, streaming=False):
            asyncio.get_running_loop()  # TensorRT-LLM builds its async queues on the caller's loop
            self.calls.append((inputs, sampling_params, streaming))
            return FakeRequestOutput(self.script, self)

        def shutdown(self):
            self.is_shut_down = True

    module.LLM = LLM
    module.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    module.instances = []
    monkeypatch.setitem(sys.modules, "tensorrt_llm", module)
    return module


OPTIONS = {"model": "/models/gpt-oss-120b", "tensor_parallel_size": 8,
           "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7}}


def test_greedy_requests_map_to_temperature_zero_without_top_k_or_top_p():
    kwargs = sampling_kwargs(GenerationRequest("x", 32), end_ids=(2, 5))
    assert kwargs == {"max_tokens": 32, "end_id": 2, "stop_token_ids": [5], "detokenize": False,
                      "return_perf_metrics": True, "temperature": 0.0}


def test_no_end_ids_ask_tensorrt_llm_to_ignore_eos():
    kwargs = sampling_kwargs(GenerationRequest("x", 32, end_id=-1), end_ids=())
    assert kwargs["ignore_eos"] is True and kwargs["end_id"] is None and kwargs["stop_token_ids"] is None
    assert "ignore_eos" not in sampling_kwargs(GenerationRequest("x", 32), end_ids=(2,))


def test_sampling_requests_pass_their_parameters_and_seed():
    kwargs = sampling_kwargs(GenerationRequest("x", 8, temperature=0.7, top_k=40, top_p=0.9, seed=3), (2,))
    assert (kwargs["temperature"], kwargs["top_k"], kwargs["top_p"], kwargs["seed"]) == (0.7, 40, 0.9, 3)
    assert kwargs["stop_token_ids"] is None
    assert sampling_kwargs(GenerationRequest("x", 8, temperature=1.0), (2,))["top_k"] is None


def test_logits_controls_pass_to_tensorrt_llm_only_when_set():
    request = GenerationRequest("x", 8, min_tokens=4, bad_words=("foo", "bar baz"), repetition_penalty=1.2,
                                presence_penalty=0.5, frequency_penalty=-0.3)
    kwargs = sampling_kwargs(request, (2,))
    assert {k: kwargs[k] for k in ("min_tokens", "bad", "add_special_tokens", "repetition_penalty",
                                   "presence_penalty", "frequency_penalty")} == {
        "min_tokens": 4, "bad": ["foo", "bar baz"], "add_special_tokens": False, "repetition_penalty": 1.2,
        "presence_penalty": 0.5, "frequency_penalty": -0.3}
    neutral = sampling_kwargs(GenerationRequest("x", 8, min_tokens=0, repetition_penalty=1.0), (2,))
    assert not neutral.keys() & {"min_tokens", "bad", "repetition_penalty", "presence_penalty", "frequency_penalty"}


def test_builds_the_llm_from_the_engine_options_and_streams_token_ids(trtllm):
    runtime = TrtllmRuntime(OPTIONS, tokenizer=None, block_size=8, default_end_ids=(2,))
    steps = list(runtime.steps([1, 2, 3], GenerationRequest("x", 16), (2,)))
    llm = trtllm.instances[0]
    assert llm.options == OPTIONS
    inputs, params, streaming = llm.calls[0]
    assert inputs == {"prompt_token_ids": [1, 2, 3]} and streaming and params.detokenize is False
    assert [s.new_token_ids for s in steps] == [[7], [8, 9, 10], [11], [12, 13]]
    assert [s.acceptance_length for s in steps] == [None, 3, 1, 2]
    assert [s.num_draft_tokens for s in steps] == [None, 7, 7, 7]
    assert steps[-1].is_final and steps[-1].finish_reason == "length"
    runtime.close()
    assert llm.is_shut_down


def test_nested_options_go_through_tensorrt_llms_own_conversion(trtllm, monkeypatch):
    llmapi, llm_utils = types.ModuleType("tensorrt_llm.llmapi"), types.ModuleType("tensorrt_llm.llmapi.llm_utils")
    llm_utils.update_llm_args_with_extra_dict = lambda base, extra: {
        **base, **extra, "speculative_config": ("DFlashDecodingConfig", extra["speculative_config"]["max_draft_len"])}
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_utils", llm_utils)
    runtime = TrtllmRuntime(OPTIONS, tokenizer=None, block_size=8)
    options = trtllm.instances[0].options
    assert options["model"] == OPTIONS["model"] and options["tensor_parallel_size"] == 8
    assert options["speculative_config"] == ("DFlashDecodingConfig", 7)
    runtime.close()


def test_acceptance_statistics_come_from_tensorrt_llm(trtllm):
    runtime = TrtllmRuntime(OPTIONS, tokenizer=None, block_size=8)
    stats = Stats(block_size=8)
    out = list(chunks(GenerationRequest("x", 16, stream=True), [1], runtime.steps([1], GenerationRequest("x", 16), ()),
                      None, stats))
    assert (stats.total_draft_tokens, stats.total_accepted_draft_tokens, stats.num_output_tokens) == (21, 3, 7)
    assert out[-1].is_final
    runtime.close()


def test_closing_the_steps_aborts_the_request(trtllm):
    runtime = TrtllmRuntime(OPTIONS, tokenizer=None, block_size=8)
    steps = runtime.steps([1], GenerationRequest("x", 16), ())
    next(steps)
    steps.close()  # what the dflash service does on cancellation
    llm = trtllm.instances[0]
    for _ in range(100):
        if llm.aborted:
            break
        asyncio.run(asyncio.sleep(0.01))
    assert len(llm.aborted) == 1
    runtime.close()


def test_errors_of_the_llm_reach_the_request(trtllm):
    def broken(*args, **kwargs):
        raise RuntimeError("KV cache exhausted")

    runtime = TrtllmRuntime(OPTIONS, tokenizer=None, block_size=8)
    trtllm.instances[0].generate_async = broken
    with pytest.raises(RuntimeError, match="KV cache exhausted"):
        list(runtime.steps([1], GenerationRequest("x", 16), ()))
    runtime.close()


# --- Request options under one-model speculation (trtllm_admission.py) ---

DFLASH_OPTIONS = {"model": "/models/gpt-oss-120b",
                  "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7, "enable_penalty": True,
                                         "use_rejection_sampling": True}}


def install_dflash_config(monkeypatch, fields=("max_draft_len", "enable_penalty", "use_rejection_sampling")):
    """tensorrt_llm.llmapi.DFlashDecodingConfig of a release with these pydantic fields."""
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.DFlashDecodingConfig = type("DFlashDecodingConfig", (), {"model_fields": dict.fromkeys(fields)})
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)


@pytest.mark.parametrize("request_, name", [
    (GenerationRequest("x", 8, min_tokens=4), "min_tokens"),
    (GenerationRequest("x", 8, bad_words=("foo",)), "bad_words"),
])
def test_options_tensorrt_llm_cannot_apply_under_dflash_are_refused_before_it_sees_them(trtllm, monkeypatch,
                                                                                     request_, name):
    from dflash_trt.serving.requests import InvalidRequest

    install_dflash_config(monkeypatch)
    runtime = TrtllmRuntime(DFLASH_OPTIONS, tokenizer=None, block_size=8)
    with pytest.raises(InvalidRequest, match=f"^input '{name}' = .* is not supported by the trtllm runtime: "
                                             "TensorRT-LLM cannot apply it under speculative decoding"):
        runtime.steps([1], request_, ())  # at once, not on the first step
    assert trtllm.instances[0].calls == []  # nothing reached TensorRT-LLM
    runtime.close()


def test_penalties_reach_tensorrt_llm_when_the_engine_enables_them(trtllm, monkeypatch):
    install_dflash_config(monkeypatch)
    runtime = TrtllmRuntime(DFLASH_OPTIONS, tokenizer=None, block_size=8)
    request = GenerationRequest("x", 16, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=-0.2)
    steps = list(runtime.steps([1], request, ()))
    (_inputs, params, _streaming), = trtllm.instances[0].calls
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) == (1.3, 0.5, -0.2)
    assert steps[-1].is_final
    runtime.close()


@pytest.mark.parametrize("enabled, fields, why", [
    (False, ("max_draft_len", "enable_penalty"), "does not set enable_penalty: true"),
    (True, ("max_draft_len",), "the installed TensorRT-LLM 9.9 has no speculative_config.enable_penalty"),
])
def test_penalties_are_refused_where_tensorrt_llm_would_refuse_or_ignore_them(trtllm, monkeypatch, enabled,
                                                                            fields, why):
    from dflash_trt.serving.requests import InvalidRequest

    install_dflash_config(monkeypatch, fields)
    trtllm.__version__ = "9.9"
    options = {**DFLASH_OPTIONS, "speculative_config": {**DFLASH_OPTIONS["speculative_config"],
                                                        "enable_penalty": enabled}}
    runtime = TrtllmRuntime(options, tokenizer=None, block_size=8)
    with pytest.raises(InvalidRequest, match=f"^input 'presence_penalty' = 0.5 is not supported by this trtllm "
                                             f"engine: .*{why}.*; send 0 or leave it out$"):
        runtime.steps([1], GenerationRequest("x", 8, presence_penalty=0.5), ())
    list(runtime.steps([1], GenerationRequest("x", 8, repetition_penalty=1.0, min_tokens=0), ()))  # neutral: fine
    assert len(trtllm.instances[0].calls) == 1
    runtime.close()


def test_without_speculation_every_option_is_tensorrt_llms_to_apply(trtllm):
    runtime = TrtllmRuntime({"model": "/models/plain"}, tokenizer=None, block_size=1)
    list(runtime.steps([1], GenerationRequest("x", 8, min_tokens=2, bad_words=("foo",), presence_penalty=0.5), ()))
    (_inputs, params, _streaming), = trtllm.instances[0].calls
    assert (params.min_tokens, params.bad, params.presence_penalty) == (2, ["foo"], 0.5)
    runtime.close()


def test_the_dflash_model_answers_a_refused_option_with_one_error_naming_it(trtllm, monkeypatch, fake_pb, tmp_path):
    import numpy as np

    from dflash_trt.serving.cancellation import CancelBoard
    from dflash_trt.serving.dflash_service import DFlashService
    from dflash_trt.serving.metrics import DFlashMetrics
    from dflash_trt.serving.requests import RequestLimits

    install_dflash_config(monkeypatch)
    runtime = TrtllmRuntime(DFLASH_OPTIONS, tokenizer=None, block_size=8, max_concurrent_requests=1)
    service = DFlashService(fake_pb, runtime, RequestLimits(max_tokens=64, max_context_tokens=128),
                            DFlashMetrics(fake_pb, "dflash"), fake_pb.Logger, CancelBoard(tmp_path / "board"))
    req = fake_pb.Request({"input_ids": np.array([5, 6, 7], dtype=np.int32), "max_tokens": np.array([8], np.int32),
                           "min_tokens": np.array([3], dtype=np.int32)})
    service.execute([req])
    (response, flags), = req.sender.sent
    assert flags == 1 and response.error.message().startswith("input 'min_tokens' = 3 is not supported")
    assert "failed:" not in response.error.message()  # a request's mistake: 400 at Triton and at the gateway
    assert trtllm.instances[0].calls == []
    runtime.close()


def test_the_load_time_canary_runs_greedy_and_sampled_on_tensorrt_llm(trtllm, monkeypatch, fake_pb):
    from dflash_trt.serving import canary
    from dflash_trt.serving.metrics import DFlashMetrics

    install_dflash_config(monkeypatch)
    runtime = TrtllmRuntime(DFLASH_OPTIONS, tokenizer=None, block_size=8)
    metrics = DFlashMetrics(fake_pb, "dflash")
    greedy, sampled = canary.check_at_load(runtime, 16, metrics, fake_pb.Logger)
    (_, greedy_params, _), (_, sampled_params, _) = trtllm.instances[0].calls
    assert greedy_params.temperature == 0.0 and not hasattr(greedy_params, "seed")
    assert (sampled_params.temperature, sampled_params.seed) == (canary.CANARY_TEMPERATURE, canary.CANARY_SEED)
    assert sampled.temperature == canary.CANARY_TEMPERATURE and sampled.num_draft_tokens == 21  # the script's
    assert metrics.canary_gauges["dflash_canary_sampled_acceptance_rate"].value == sampled.acceptance_rate
    runtime.close()
