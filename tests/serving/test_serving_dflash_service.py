"""The decoupled dflash model's request handling, with a stand-in for Triton and a scripted runtime."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.serving.cancellation import CancelBoard
from dflash_trt.serving.dflash_service import OUTPUTS, DFlashService
from dflash_trt.serving.generation import Step
from dflash_trt.serving.metrics import DFlashMetrics
from dflash_trt.serving.requests import RequestLimits


class ScriptedRuntime:
    """Commits one token per step (1000, 1001, ...); records whether the loop was closed."""

    block_size = 4
    default_end_ids = (2,)
    max_concurrent_requests = 1

    def __init__(self, tokenizer, fail_at=None):
        self.tokenizer, self.fail_at = tokenizer, fail_at
        self.closed, self.steps_run, self.requests = 0, 0, []

    def steps(self, prompt_ids, request, end_ids):
        self.requests.append((prompt_ids, request, end_ids))
        try:
            for i in range(request.max_tokens):
                if i == self.fail_at:
                    raise RuntimeError("device lost")
                self.steps_run += 1
                last = i == request.max_tokens - 1
                yield Step([1000 + i], None if i == 0 else 1, last, "length" if last else "")
        finally:
            self.closed += 1

    def close(self):
        pass


@pytest.fixture
def service(fake_pb, smollm2_tokenizer, tmp_path):
    runtime = ScriptedRuntime(smollm2_tokenizer)
    metrics = DFlashMetrics(fake_pb, "dflash")
    return DFlashService(fake_pb, runtime, RequestLimits(max_tokens=64, max_context_tokens=128), metrics,
                         fake_pb.Logger, CancelBoard(tmp_path / "board"))


def request(fake_pb, max_tokens=5, stream=True, **extra):
    inputs = {"input_ids": np.array([5, 6, 7], dtype=np.int32), "max_tokens": np.array([max_tokens], dtype=np.int32),
              "stream": np.array([stream]), **extra}
    return fake_pb.Request({k: v for k, v in inputs.items() if v is not None})


def test_streams_one_response_per_step_with_the_final_flag_on_the_last(fake_pb, service):
    req = request(fake_pb)
    service.execute([req])
    assert [flags for _, flags in req.sender.sent] == [0, 0, 0, 0, 1]
    first, last = req.sender.sent[0][0], req.sender.sent[-1][0]
    assert set(first.outputs) == set(OUTPUTS)
    assert last.outputs["finish_reason"][0] == b"length" and last.outputs["num_output_tokens"][0] == 5
    assert last.outputs["total_draft_tokens"][0] == 4 * 3  # 4 verify steps x (block 4 - 1)


def test_without_streaming_sends_exactly_one_final_response(fake_pb, service):
    req = request(fake_pb, stream=False, exclude_input_in_output=np.array([True]))
    service.execute([req])
    assert len(req.sender.sent) == 1 and req.sender.sent[0][1] == 1
    assert req.sender.sent[0][0].outputs["output_ids"].tolist() == [1000, 1001, 1002, 1003, 1004]


def test_passes_sampling_parameters_and_end_id_to_the_runtime(fake_pb, service):
    service.execute([request(fake_pb, temperature=np.array([0.5], dtype=np.float32),
                             top_k=np.array([7], dtype=np.int32), seed=np.array([9], dtype=np.uint64),
                             end_id=np.array([11], dtype=np.int32))])
    prompt, gen, end_ids = service.runtime.requests[0]
    assert prompt == [5, 6, 7] and end_ids == (11,)
    assert (gen.temperature, gen.top_k, gen.seed) == (0.5, 7, 9)


def test_uses_the_models_end_ids_by_default(fake_pb, service):
    service.execute([request(fake_pb)])
    assert service.runtime.requests[0][2] == (2,)


def test_end_id_minus_one_runs_without_end_ids(fake_pb, service):
    service.execute([request(fake_pb, end_id=np.array([-1], dtype=np.int32))])
    assert service.runtime.requests[0][2] == ()


@pytest.mark.parametrize("overrides, message", [
    ({"max_tokens": np.array([0], dtype=np.int32)}, "max_tokens must be in [1, 64]"),
    ({"max_tokens": np.array([100], dtype=np.int32)}, "max_tokens must be in [1, 64]"),
    ({"input_ids": np.array([], dtype=np.int32)}, "input_ids is empty"),
    ({"end_id": np.array([49152], dtype=np.int32)}, "end_id 49152 is outside the vocabulary [0, 49152)"),
    ({"top_p": np.array([0.0], dtype=np.float32)}, "top_p must be in (0, 1]"),
])
def test_a_bad_request_gets_one_error_response_with_the_final_flag(fake_pb, service, overrides, message):
    req = request(fake_pb)
    req.inputs.update({k: fake_pb.Tensor(k, v) for k, v in overrides.items()})
    service.execute([req])
    (response, flags), = req.sender.sent
    assert flags == 1 and message in response.error.message()
    assert service.runtime.steps_run == 0


def test_without_a_tokenizer_the_vocabulary_is_the_targets_embedding_rows(fake_pb, tmp_path):
    from types import SimpleNamespace

    runtime = ScriptedRuntime(tokenizer=None)
    runtime.target = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=300)))
    service = DFlashService(fake_pb, runtime, RequestLimits(max_tokens=64, max_context_tokens=128),
                            DFlashMetrics(fake_pb, "dflash"), fake_pb.Logger, CancelBoard(tmp_path / "board"))
    req = request(fake_pb, end_id=np.array([300], dtype=np.int32))
    service.execute([req])
    assert "end_id 300 is outside the vocabulary [0, 300)" in req.sender.sent[0][0].error.message()


def test_a_failure_mid_stream_still_ends_the_stream_with_an_error(fake_pb, service):
    service.runtime.fail_at = 2
    req = request(fake_pb)
    service.execute([req])
    assert [flags for _, flags in req.sender.sent] == [0, 0, 1]
    assert "device lost" in req.sender.sent[-1][0].error.message()
    assert service.runtime.closed == 1
    assert any(level == "error" for level, _ in fake_pb.Logger.lines)


def test_cancellation_stops_generation_and_sends_only_the_final_flag(fake_pb, service):
    req = request(fake_pb, max_tokens=50)
    req.cancel_after = 2
    service.execute([req])
    assert service.runtime.steps_run == 2 and service.runtime.closed == 1
    assert req.sender.sent[-1] == (None, 1)


def test_a_cancellation_marked_on_the_board_stops_an_ensemble_request(fake_pb, service):
    req = request(fake_pb, max_tokens=50)
    original_send = req.sender.send

    def send_and_cancel(response=None, flags=0):
        original_send(response, flags)
        if len(req.sender.sent) == 3:  # what postprocessing does when Triton cancels its request
            service.board.mark(response.outputs["generation_id"][0].decode())

    req.sender.send = send_and_cancel
    service.execute([req])
    assert service.runtime.steps_run == 3
    assert list(service.board.directory.iterdir()) == []  # the mark is cleared with the request


def test_metrics_follow_the_requests(fake_pb, service):
    service.execute([request(fake_pb), request(fake_pb, max_tokens=3)])
    counters = {name: m.value for name, m in service.metrics.counters.items()}
    assert counters["dflash_generated_tokens_total"] == 8
    assert counters["dflash_spec_steps_total"] == 6
    assert counters["dflash_draft_tokens_total"] == 6 * 3
    assert counters["dflash_accepted_draft_tokens_total"] == 0
    assert service.metrics.acceptance.observations == [1] * 6
    assert service.metrics.in_flight.value == 0


def test_finalize_reports_a_drained_instance(service):
    assert service.finalize(timeout_s=1)
