"""End to end: concurrent streams are all correct, and a cancelled stream frees its model instance."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
from triton_waits import metric_total, steps_until_idle, wait_for

from dflash_trt.serving.client import GrpcStream, generate, generate_stream, join_text

pytestmark = pytest.mark.slow

PROMPTS = [f"Request number {i}: tell me about {topic}." for i, topic in
           enumerate(["rivers", "mountains", "Ω and ∑", "the moon 🌙", "cats", "tea", "rain", "maps"] * 2)]


def test_16_concurrent_streams_are_all_correct(triton):
    expected = [generate(triton.config.http_url, p, 16, exclude_input_in_output=True)["text_output"] for p in PROMPTS]

    def stream(index):
        if index % 2:  # half over gRPC, half over HTTP server-sent events
            client = GrpcStream(triton.config.grpc_url)
            try:
                return join_text(list(client.chunks(PROMPTS[index], 16)))
            finally:
                client.close()
        return join_text(list(generate_stream(triton.config.http_url, PROMPTS[index], 16)))

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(stream, range(len(PROMPTS))))
    assert answers == expected


CANCELLED = "request cancelled by the client"


def test_cancelling_grpc_streams_stops_each_within_one_step_and_frees_the_instances(triton, step_gate):
    """Decoding is held after the first step of each stream, so what is counted does not depend on speed:
    Triton tells a running dflash step nothing, the one step after the cancel carries it to postprocessing."""
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    cancelled_before = triton.log.count(CANCELLED)
    with step_gate.holding():
        streams = [GrpcStream(triton.config.grpc_url) for _ in range(2)]  # occupy both dflash instances
        for stream in streams:
            next(stream.chunks("a long answer please", 256))
        wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 2, "both generations held")
        for stream in streams:
            stream.cancel()
        assert steps_until_idle(triton, step_gate) <= len(streams)
    wait_for(lambda: triton.log.count(CANCELLED) == cancelled_before + 2, "both cancellations logged")
    out = generate(triton.config.http_url, "are you free?", 4, exclude_input_in_output=True)
    assert out["num_output_tokens"] == 4


def test_closing_an_http_stream_stops_its_generation_within_one_step(triton, step_gate):
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    cancelled_before = triton.log.count(CANCELLED)
    body = json.dumps({"text_input": "a long answer please", "max_tokens": 256, "stream": True}).encode()
    with step_gate.holding():
        with socket.create_connection(("127.0.0.1", triton.config.http_port)) as sock:
            sock.sendall(b"POST /v2/models/ensemble/generate_stream HTTP/1.1\r\nHost: localhost\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            received = b""
            while b"data:" not in received:
                received += sock.recv(4096)
        assert steps_until_idle(triton, step_gate) <= 1
    wait_for(lambda: triton.log.count(CANCELLED) == cancelled_before + 1, "the cancellation logged")
