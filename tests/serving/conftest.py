"""Shared fixtures of the serving tests (SmolLM2's tokenizer and the tiny engine are in tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from triton_waits import StepGateControl

@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))



@pytest.fixture
def server_config():
    """Factory of ServerConfig on free loopback ports."""
    from dflash_trt.serving.server import ServerConfig, free_ports

    def make(repository, **overrides):
        http, grpc, metrics = free_ports(3)
        return ServerConfig(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics,
                            **overrides)

    return make


class FakeTensor:
    def __init__(self, name, array):
        import numpy as np

        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class FakeError:
    CANCELLED = "CANCELLED"

    def __init__(self, message, code=None):
        self._message, self.code = message, code

    def message(self):
        return self._message


class FakeResponse:
    def __init__(self, output_tensors=(), error=None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class FakeSender:
    def __init__(self, request):
        self.request = request
        self.sent = []  # (response or None, flags)

    def send(self, response=None, flags=0):
        if self.sent and self.sent[-1][1]:
            raise RuntimeError("response sender is closed")
        self.sent.append((response, flags))

    def is_cancelled(self):
        return self.request.cancel_after is not None and len(self.sent) >= self.request.cancel_after


class FakeRequest:
    """A Triton request; cancel_after=N reports cancellation once N responses went out."""

    def __init__(self, inputs, cancel_after=None, cancelled=False):
        self.inputs = {name: FakeTensor(name, value) for name, value in inputs.items()}
        self.cancel_after = cancel_after
        self.cancelled = cancelled
        self.sender = FakeSender(self)

    def get_response_sender(self):
        return self.sender

    def is_cancelled(self):
        return self.cancelled


class FakeMetric:
    def __init__(self, family, labels, buckets=None):
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value, self.observations = 0.0, []

    def increment(self, value):
        if self.family.kind == FakeMetricFamily.COUNTER and value < 0:
            raise ValueError("counters only go up")
        self.value += value

    def set(self, value):
        self.value = value

    def observe(self, value):
        self.observations.append(value)


class FakeMetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name, description, kind):
        self.name, self.description, self.kind = name, description, kind
        self.metrics = []

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - Triton's spelling
        if (self.kind == self.HISTOGRAM) != (buckets is not None):
            raise ValueError("buckets go with histograms only")
        metric = FakeMetric(self, labels, buckets)
        self.metrics.append(metric)
        return metric


class FakeLogger:
    def __init__(self):
        self.lines = []

    def __getattr__(self, name):
        if name.startswith("log_"):
            return lambda message: self.lines.append((name[4:], message))
        raise AttributeError(name)


@pytest.fixture
def fake_pb():
    """A stand-in for triton_python_backend_utils with the parts the models use."""
    import types

    pb = types.SimpleNamespace(
        Tensor=FakeTensor, InferenceResponse=FakeResponse, TritonError=FakeError, MetricFamily=FakeMetricFamily,
        Logger=FakeLogger(), TRITONSERVER_RESPONSE_COMPLETE_FINAL=1,
        get_input_tensor_by_name=lambda request, name: request.inputs.get(name),
    )
    pb.Request = FakeRequest
    return pb


@pytest.fixture(scope="session")
def served_repo(tiny_engine, tmp_path_factory) -> Path:
    """The tiny engine's repository: two dflash instances, small limits so that limit errors are cheap, the
    block size pinned so that draft counts are known (the adaptive policy has tests of its own)."""
    from dflash_trt.serving.repo import RepoConfig, render_repository

    out = tmp_path_factory.mktemp("served-repo")
    render_repository(RepoConfig(tiny_engine, out, dflash_instances=2, max_tokens_limit=256,
                                 max_context_tokens=512, num_threads=1, block_policy="fixed"))
    return out


@pytest.fixture(scope="session")
def step_gate_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("step-gate")


@pytest.fixture
def step_gate(step_gate_dir) -> StepGateControl:
    return StepGateControl(step_gate_dir)


@pytest.fixture(scope="session")
def triton(served_repo, tmp_path_factory, step_gate_dir):
    """The real tritonserver on free loopback ports, serving `served_repo` for the whole session.

    Its dflash models obey the step gate (open unless a test holds it, see StepGateControl)."""
    from dflash_trt.serving.cancellation import STEP_GATE_ENV
    from dflash_trt.serving.server import serve_on_free_ports

    log = tmp_path_factory.mktemp("triton") / "server.log"
    os.environ[STEP_GATE_ENV] = str(step_gate_dir)  # tritonserver and its Python stubs inherit it
    try:
        server = serve_on_free_ports(served_repo, ready_timeout_s=600, log_path=log)
    finally:
        del os.environ[STEP_GATE_ENV]
    with server:
        yield server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that used the server shows the end of the server's log."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("triton")
    if report.failed and server is not None:
        report.sections.append(("tritonserver log (last 60 lines)", "\n".join(server.log.splitlines()[-60:])))


@pytest.fixture(scope="session")
def onnx_pair_engines(tmp_path_factory, smollm2_tokenizer_dir) -> dict[str, Path]:
    """torch and onnx engines of one tiny pair whose drafter has the plugin's head_dim (64)."""
    import shutil

    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("onnx-pair")
    target = make_tiny_target("llama", root / "target", vocab_size=49152, hidden_size=256)
    for item in smollm2_tokenizer_dir.iterdir():
        shutil.copy(item, root / "target" / item.name)
    make_tiny_drafter(target.config, root / "drafter", block_size=8)
    engines = {}
    for runtime in ("torch", "onnx"):
        engines[runtime] = root / runtime
        build_engine(BuildRequest(model="smollm2-135m", target=root / "target", drafter=root / "drafter",
                                  runtime=runtime, out=engines[runtime]), log=lambda _line: None)
    return engines
