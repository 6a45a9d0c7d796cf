"""End to end: concurrent streams are all correct, and a cancelled stream frees its model instance."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

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


def long_generation_time(triton) -> float:
    start = time.monotonic()
    generate(triton.config.http_url, "warm up", 200, exclude_input_in_output=True)
    return time.monotonic() - start


def test_cancelling_a_grpc_stream_frees_the_instance(triton):
    full = long_generation_time(triton)
    cancelled_before = triton.log.count("request cancelled by the client")
    streams = [GrpcStream(triton.config.grpc_url) for _ in range(2)]  # occupy both dflash instances
    for stream in streams:
        chunks = stream.chunks("a long answer please", 256)
        for _ in range(3):
            next(chunks)
        stream.cancel()
    start = time.monotonic()
    out = generate(triton.config.http_url, "are you free?", 4, exclude_input_in_output=True)
    waited = time.monotonic() - start
    assert out["num_output_tokens"] == 4
    assert waited < full / 2, f"follow-up took {waited:.1f} s; a full generation takes {full:.1f} s"
    deadline = time.monotonic() + 10
    while triton.log.count("request cancelled by the client") < cancelled_before + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert triton.log.count("request cancelled by the client") == cancelled_before + 2


def test_closing_an_http_stream_stops_its_generation(triton):
    cancelled_before = triton.log.count("request cancelled by the client")
    body = json.dumps({"text_input": "a long answer please", "max_tokens": 256, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", triton.config.http_port)) as sock:
        sock.sendall(b"POST /v2/models/ensemble/generate_stream HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        received = b""
        while received.count(b"data:") < 3:
            received += sock.recv(4096)
    deadline = time.monotonic() + 10
    while triton.log.count("request cancelled by the client") == cancelled_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert triton.log.count("request cancelled by the client") == cancelled_before + 1
