"""kill -9 of each model process of the real server mid-stream: in-flight requests get an error promptly,
the model-aware health turns false within seconds, and the supervisor restarts the server; once its
restarts are spent it exits non-zero (a container's orchestrator then restarts it), leaving nothing behind.

Triton alone would do none of this (server#8604, #7862): its health stays 200, in-flight requests wait for
their own timeout, and new ones fail with "Stub process 'dflash_0_0' is not healthy" forever."""

from __future__ import annotations

import os
import signal
import time

import pytest
from faults_harness import Served, group_members, start_streams, wait_for

from dflash_trt.serving import model_processes as procs
from dflash_trt.serving.client import generate

pytestmark = pytest.mark.slow

MAX_RESTARTS = 2
STREAMS = 4
HEALTH_BOUND_S = 10.0  # the supervisor looks every 0.5 s; generous for a loaded machine
ERROR_BOUND_S = 60.0  # every in-flight client has its error by then (Triton alone: never)


def kill_mid_stream(served: Served, model: str) -> dict:
    """Hold streams in flight, SIGKILL `model`'s process; check the errors and the health. Returns facts of
    the server that died (its process group and shared-memory regions) for the caller to check after."""
    served.gate.hold()
    streams = start_streams(served, STREAMS, max_tokens=64)
    victim = served.model_process(model)
    (triton_pid,) = served.tritonserver_pids()
    regions = served.shm_regions()
    assert len(regions) >= 3, regions  # one per model process, under this server's own prefix

    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    status, body = wait_for(lambda: (lambda s, b: (s, b) if s != 200 else None)(*served.health()),
                            "the health to turn false", HEALTH_BOUND_S, poll_s=0.05)
    assert status in (503, None), (status, body)  # 503 while the supervisor restarts, None once it has exited
    if status == 503:
        assert f"model process {victim.instance} (pid {victim.pid}) died" in (body["problem"] or body["last_failure"])
    served.gate.release()

    for stream in streams:
        stream.join(ERROR_BOUND_S)
        assert not stream.is_alive(), f"a {stream.kind} stream still waits {ERROR_BOUND_S:.0f} s after the kill"
        assert stream.outcome == "error", (stream.kind, stream.outcome, stream.detail, stream.chunks[-1:])
        assert stream.ended_at - killed_at < ERROR_BOUND_S
    return {"triton_pid": triton_pid, "regions": regions}


def assert_nothing_left(served: Served, died: dict) -> None:
    assert group_members(died["triton_pid"]) == [], "processes of the dead server are still running"
    assert not (died["regions"] & served.shm_regions()), "the dead server's shared memory is still there"


@pytest.fixture(scope="module")
def served(fault_repo, tmp_path_factory):
    server = Served(fault_repo, tmp_path_factory.mktemp("death"), "--max-restarts", str(MAX_RESTARTS))
    try:
        server.wait_ready()
        yield server
    finally:
        server.gate.release()
        server.stop()


def test_each_model_process_killed_mid_stream_fails_fast_and_is_recovered(served):
    # One server for the three deaths (each restart reloads the models): dflash and preprocessing are
    # restarted, and the third death finds the restarts spent.
    for restarts, model in enumerate(("dflash", "preprocessing"), start=1):
        died = kill_mid_stream(served, model)
        body = served.wait_ready()
        assert body["restarts"] == restarts, body
        assert served.health("live")[0] == 200
        assert generate(served.http_url, "back again?", 3)["num_output_tokens"] == 3
        assert served.tritonserver_pids() != [died["triton_pid"]]
        assert_nothing_left(served, died)

    died = kill_mid_stream(served, "postprocessing")
    served.process.wait(timeout=120)
    assert served.process.returncode == 2, served.log()
    assert "model process postprocessing_0_0" in served.log_path.read_text()
    assert f"after {MAX_RESTARTS} restart(s) of {MAX_RESTARTS} allowed" in served.log_path.read_text()
    assert procs.descendants(served.pid) == []
    assert_nothing_left(served, died)
    assert served.shm_regions() == set()
