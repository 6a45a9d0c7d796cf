"""SIGTERM with streams running: in-flight streams finish within the configured drain, and afterwards no
process of the server and none of its shared-memory regions is left; a drain that runs out ends the
streams with an error and still leaves nothing behind (a busy model process that ignored SIGTERM included)."""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

import pytest
from faults_harness import Served, group_members, start_streams, wait_for

from dflash_trt.serving import model_processes as procs

pytestmark = pytest.mark.slow

STREAMS = 4
MAX_TOKENS = 12


def stop_facts(served: Served) -> dict:
    (triton_pid,) = served.tritonserver_pids()
    return {"triton_pid": triton_pid, "regions": served.shm_regions()}


def assert_nothing_left(served: Served, facts: dict) -> None:
    assert procs.descendants(served.pid) == []
    assert group_members(facts["triton_pid"]) == [], "a process of the server outlived it"
    assert len(facts["regions"]) >= 3 and served.shm_regions() == set(), "shared memory left in /dev/shm"
    assert not (Path(tempfile.gettempdir()) / f"dflash-cancelled-{facts['triton_pid']}").exists()


def test_sigterm_lets_running_streams_finish_then_leaves_nothing(fault_repo, tmp_path):
    served = Served(fault_repo, tmp_path, "--drain-timeout", "300")
    try:
        served.wait_ready()
        served.gate.hold()
        streams = start_streams(served, STREAMS, MAX_TOKENS)
        facts = stop_facts(served)
        served.process.send_signal(signal.SIGTERM)
        wait_for(lambda: served.health()[1].get("status") == "draining", "the health to say draining", 30)
        assert served.health()[0] == 503  # out of the load balancer while it drains
        served.gate.release()  # the held steps go on: the streams run to their end during the drain
        for stream in streams:
            stream.join(240)
            assert stream.outcome == "complete", (stream.kind, stream.outcome, stream.detail)
            assert stream.tokens == MAX_TOKENS
        assert served.process.wait(timeout=240) == 0, served.log()
        assert_nothing_left(served, facts)
    finally:
        served.gate.release()
        served.stop()


def test_a_drain_that_runs_out_ends_the_streams_and_kills_every_process(fault_repo, tmp_path):
    drain_s = 3
    served = Served(fault_repo, tmp_path, "--drain-timeout", str(drain_s))
    try:
        served.wait_ready()
        served.gate.hold()  # never released: the generations cannot finish, the dflash process stays busy
        streams = start_streams(served, 2, MAX_TOKENS)
        facts = stop_facts(served)
        stopped_at = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=drain_s + 120) == 0, served.log()
        for stream in streams:
            stream.join(60)
            assert stream.outcome == "error", (stream.kind, stream.outcome, stream.detail)
            # Cut only once the drain was over, not at the signal.
            assert stream.ended_at - stopped_at >= drain_s - 0.5
        assert_nothing_left(served, facts)
    finally:
        served.gate.release()
        served.stop()


def test_streams_the_clients_cancelled_do_not_hold_the_drain(fault_repo, tmp_path):
    """A client that cancels its gRPC stream leaves nothing in flight in Triton: SIGTERM finds no request to wait
    for. (When the postprocessing step of a cancelled ensemble request answered with an error, Triton 2.51 kept
    that request in flight for good, and every later drain waited out its whole timeout.)"""
    from dflash_trt.serving.client import GrpcStream

    served = Served(fault_repo, tmp_path, "--drain-timeout", "30")  # a request left in flight: 30 s
    try:
        served.wait_ready()
        served.gate.hold()  # the first chunk comes, then the generation waits: the cancel lands mid-generation
        stream = GrpcStream(served.grpc_url)
        next(stream.chunks("Tell me a story", 256))
        stream.cancel()
        served.gate.release()
        triton_log = tmp_path / "triton.log"
        wait_for(lambda: "request cancelled by the client" in triton_log.read_text(), "the cancel to stop the "
                 "generation", 120)
        wait_for(lambda: served.in_flight() == 0, "the generation to end", 60)
        stream.close()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=240) == 0, served.log()
        drain = triton_log.read_text().split("Waiting for in-flight requests to complete.", 1)[-1]
        assert "Found 0 model versions that have in-flight inferences" in drain, served.log()
        assert "Exit timeout expired" not in drain
    finally:
        served.gate.release()
        served.stop()
