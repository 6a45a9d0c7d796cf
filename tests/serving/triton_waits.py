"""Waiting on conditions of the session's tritonserver (never fixed sleeps), pacing its decoding steps, and
checking that it is still healthy after a refused request."""

from __future__ import annotations

import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest


class StepGateControl:
    """The test's side of the dflash models' StepGate: hold the decoding steps, grant them one by one."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.granted = 0

    @contextmanager
    def holding(self):
        (self.directory / "hold").touch()
        try:
            yield self
        finally:
            (self.directory / "hold").unlink()
            for permit in self.directory.glob("permit-*"):
                permit.unlink(missing_ok=True)

    def grant(self) -> None:
        self.granted += 1
        (self.directory / f"permit-{self.granted:06d}").touch()


def wait_for(condition, what: str, timeout_s: float = 120.0, poll_s: float = 0.02):
    """Wait until condition() is true; the timeout is generous: it is only reached when something is broken."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(poll_s)


def metric_total(triton, name: str) -> float:
    """The sum of a metric over its labels, from Triton's metrics port."""
    with urllib.request.urlopen(triton.config.metrics_url, timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def steps_until_idle(triton, gate: StepGateControl, max_steps: int = 4, wait_s: float = 30.0) -> int:
    """Grant decoding steps one at a time until no request is in flight; returns how many it took.

    After each step the requests get wait_s for one of them to end (a cancelled one ends without a
    further step); that wait is only spent in full when the generations go on."""
    steps = 0
    in_flight = metric_total(triton, "dflash_requests_in_flight")
    while in_flight > 0:
        if steps == max_steps:
            pytest.fail(f"{in_flight:.0f} generation(s) still running after {steps} more decoding steps")
        gate.grant()
        steps += 1
        deadline = time.monotonic() + wait_s
        before = in_flight
        while in_flight >= before and time.monotonic() < deadline:
            time.sleep(0.02)
            in_flight = metric_total(triton, "dflash_requests_in_flight")
    return steps


def is_healthy(triton) -> bool:
    """Ready, and still answering a small request."""
    from dflash_trt.serving.client import generate

    with urllib.request.urlopen(triton.config.http_url + "/v2/health/ready", timeout=5) as response:
        ready = response.status == 200
    return ready and generate(triton.config.http_url, "still there?", 2)["num_output_tokens"] == 2


def post(triton, body: dict) -> dict:
    """A raw /generate body for the ensemble, so that any field can be left out or added."""
    from dflash_trt.serving.client import MODEL, _post_json

    return _post_json(f"{triton.config.http_url}/v2/models/{MODEL}/generate", body, 60)
