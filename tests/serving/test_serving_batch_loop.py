"""The dflash model's in-flight batching: one scheduler per instance, driven by its loop thread
(real runtime on a tiny engine, a stand-in for Triton's request objects)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.scheduler.scheduler import SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.serving.cancellation import CancelBoard
from dflash_trt.serving.dflash_service import DFlashService
from dflash_trt.serving.metrics import DFlashMetrics
from dflash_trt.serving.requests import RequestLimits
from dflash_trt.serving.runtime import open_runtime

PROMPTS = [[5, 6, 7], [100, 200, 300, 400, 500, 600, 700], [42], [9, 8, 7, 6, 5], [1000, 2000]]


@pytest.fixture(scope="module")
def runtime(tiny_engine):
    return open_runtime(tiny_engine, num_threads=1, limits=SchedulerLimits(max_batch_size=3, prefill_chunk_tokens=4))


@pytest.fixture
def service(fake_pb, runtime, tmp_path):
    service = DFlashService(fake_pb, runtime, RequestLimits(max_tokens=64, max_context_tokens=128),
                            DFlashMetrics(fake_pb, "dflash"), fake_pb.Logger, CancelBoard(tmp_path / "board"))
    yield service
    assert service.finalize(timeout_s=60)


def make_request(fake_pb, prompt, max_tokens, stream=True, cancel_after=None, **extra):
    inputs = {"input_ids": np.array(prompt, dtype=np.int32), "max_tokens": np.array([max_tokens], dtype=np.int32),
              "stream": np.array([stream]), "exclude_input_in_output": np.array([True]), **extra}
    return fake_pb.Request(inputs, cancel_after=cancel_after)


def wait_final(requests, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not all(r.sender.sent and r.sender.sent[-1][1] for r in requests):
        assert time.monotonic() < deadline, "requests did not finish"
        time.sleep(0.01)


def tokens_of(request):
    ids = []
    for response, _flags in request.sender.sent:
        if response is not None and response.error is None:
            ids += response.outputs["output_ids"].tolist()[response.outputs["num_context_tokens"][0]:]
    return ids


def alone(runtime, prompt, max_tokens, **params):
    params = SamplingParams(max_new_tokens=max_tokens, stop_token_ids=runtime.default_end_ids, **params)
    return generate(runtime.target, runtime.drafter, [prompt], params)[0].token_ids


def test_every_request_of_one_execute_is_batched_and_gets_its_alone_tokens(fake_pb, service, runtime):
    requests = [make_request(fake_pb, p, 6 + 3 * i) for i, p in enumerate(PROMPTS)]
    service.execute(requests)  # more than max_batch_size: execute returns once there is room
    wait_final(requests)
    for i, (prompt, request) in enumerate(zip(PROMPTS, requests)):
        expected = [t for t in alone(runtime, prompt, 6 + 3 * i) if t not in runtime.default_end_ids]
        assert tokens_of(request) == expected, f"request {i}"
        assert request.sender.sent[-1][0].outputs["finish_reason"][0] in (b"length", b"stop")


def test_seeded_sampled_request_is_unchanged_by_its_batch(fake_pb, service, runtime):
    sampled = dict(temperature=np.array([1.0], dtype=np.float32), seed=np.array([77], dtype=np.uint64))
    requests = [make_request(fake_pb, PROMPTS[1], 12, **sampled)] + [make_request(fake_pb, p, 10) for p in PROMPTS[2:]]
    service.execute(requests)
    wait_final(requests)
    expected = [t for t in alone(runtime, PROMPTS[1], 12, temperature=1.0, seed=77) if t not in runtime.default_end_ids]
    assert tokens_of(requests[0]) == expected


def test_a_bad_request_errors_alone_and_the_others_finish(fake_pb, service, runtime):
    good = [make_request(fake_pb, PROMPTS[0], 8), make_request(fake_pb, PROMPTS[3], 8)]
    bad = make_request(fake_pb, PROMPTS[1], 1000)  # above max_tokens_limit
    service.execute([good[0], bad, good[1]])
    wait_final(good + [bad])
    assert len(bad.sender.sent) == 1 and "max_tokens must be in" in bad.sender.sent[0][0].error.message()
    for prompt, request in zip((PROMPTS[0], PROMPTS[3]), good):
        assert tokens_of(request) == [t for t in alone(runtime, prompt, 8) if t not in runtime.default_end_ids]


def test_a_cancelled_request_leaves_and_the_others_are_unchanged(fake_pb, service, runtime):
    cancelled = make_request(fake_pb, PROMPTS[1], 60, cancel_after=2)
    others = [make_request(fake_pb, PROMPTS[0], 20), make_request(fake_pb, PROMPTS[2], 20)]
    service.execute([cancelled] + others)
    wait_final([cancelled] + others)
    assert [flags for _, flags in cancelled.sender.sent][-1] == 1
    assert len(cancelled.sender.sent) <= 4  # two chunks, at most one more step, then the final flag alone
    assert cancelled.sender.sent[-1][0] is None
    for prompt, request in zip((PROMPTS[0], PROMPTS[2]), others):
        assert tokens_of(request) == [t for t in alone(runtime, prompt, 20) if t not in runtime.default_end_ids]
    assert any("request cancelled by the client" in line for _level, line in fake_pb.Logger.lines)


def test_a_full_batch_holds_execute_until_there_is_room(fake_pb, service):
    first = [make_request(fake_pb, p, 40) for p in PROMPTS[:3]]
    service.execute(first)
    late = make_request(fake_pb, PROMPTS[3], 4)
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (service.execute([late]), returned.set()))
    thread.start()
    wait_final(first + [late])
    thread.join(60)
    assert returned.is_set()
    assert service._loop.scheduler.num_requests == 0


def test_metrics_count_the_batched_steps(fake_pb, service):
    requests = [make_request(fake_pb, p, 10) for p in PROMPTS[:3]]
    service.execute(requests)
    wait_final(requests)
    deadline = time.monotonic() + 30
    while service.metrics.in_flight.value != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    counters = service.metrics.counters
    sent = sum(int(r.sender.sent[-1][0].outputs["num_output_tokens"][0]) for r in requests)
    assert counters["dflash_generated_tokens_total"].value == sent
    assert counters["dflash_spec_steps_total"].value >= 3 and service.metrics.in_flight.value == 0
