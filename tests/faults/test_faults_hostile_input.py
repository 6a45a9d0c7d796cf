"""Hostile HTTP bodies against the real server: the request that kills tritonserver 2.51 (JSON nested 60,000
deep) gets a 4xx from the guard on every endpoint, and the same server process goes on serving."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import pytest
from faults_harness import Served

from dflash_trt.serving.client import GrpcStream, RequestFailed, generate

pytestmark = pytest.mark.slow

DEPTH = 60_000  # tritonserver 2.51 dies with SIGSEGV here (30,000 still parses)
MAX_BODY = 1_000_000


def nested(depth: int, leaf: str = '"hi"') -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.fixture(scope="module")
def served(fault_repo, tmp_path_factory):
    server = Served(fault_repo, tmp_path_factory.mktemp("hostile"), "--max-body-bytes", str(MAX_BODY))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def post(served: Served, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(served.http_url + path, data=body,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def still_serving(served: Served, triton_pid: int) -> None:
    """The same tritonserver process (never restarted) is ready and answers a request."""
    assert served.tritonserver_pids() == [triton_pid], served.log()
    status, body = served.health()
    assert status == 200 and body["restarts"] == 0, body
    assert generate(served.http_url, "still there?", 2)["num_output_tokens"] == 2


DEEP_BODIES = {
    "generate": ("/v2/models/ensemble/generate", '{"text_input": %s, "max_tokens": 4}' % nested(DEPTH)),
    "generate_stream": ("/v2/models/ensemble/generate_stream",
                        '{"text_input": %s, "max_tokens": 4, "stream": true}' % nested(DEPTH)),
    "infer dflash": ("/v2/models/dflash/infer",
                     '{"inputs": [{"name": "input_ids", "shape": [1], "datatype": "INT32", "data": %s}]}'
                     % nested(DEPTH, "1")),
    "infer preprocessing": ("/v2/models/preprocessing/infer",
                            '{"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": %s}]}'
                            % nested(DEPTH)),
    "repository index": ("/v2/repository/index", '{"ready": %s}' % nested(DEPTH, "true")),
}


@pytest.mark.parametrize("endpoint", sorted(DEEP_BODIES))
def test_deeply_nested_json_is_refused_and_the_server_serves_on(served, endpoint):
    triton_pid = served.tritonserver_pids()[0]
    path, body = DEEP_BODIES[endpoint]
    assert len(body) > 100_000  # the ~120 KB body of the report
    status, answer = post(served, path, body.encode())
    assert status == 400, answer
    assert "nests deeper than 100 levels" in answer["error"]
    still_serving(served, triton_pid)


def test_a_compressed_deep_body_is_refused_too(served):
    # Triton decompresses gzip bodies before parsing them: the guard must look inside as well.
    triton_pid = served.tritonserver_pids()[0]
    path, body = DEEP_BODIES["generate"]
    status, answer = post(served, path, gzip.compress(body.encode()), {"Content-Encoding": "gzip"})
    assert status == 400 and "nests deeper" in answer["error"], answer
    still_serving(served, triton_pid)


def test_only_the_json_header_of_a_binary_request_is_scanned(served):
    # Binary tensor extension: the first Inference-Header-Content-Length bytes are JSON, the rest raw bytes.
    header = json.dumps({"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 4 + 4}}]}).encode()
    raw = len(b"[[[[").to_bytes(4, "little") + b"[[[["  # a BYTES element: length, then bytes full of brackets
    deep = nested(DEPTH).encode()
    status, answer = post(served, "/v2/models/preprocessing/infer", deep + raw,
                          {"Inference-Header-Content-Length": str(len(deep))})
    assert status == 400 and "nests deeper" in answer["error"], answer
    status, answer = post(served, "/v2/models/preprocessing/infer", header + raw,
                          {"Inference-Header-Content-Length": str(len(header))})
    assert "nests deeper" not in answer.get("error", ""), answer  # the brackets in the tensor are data


def test_a_body_over_the_limit_is_refused_with_413(served):
    triton_pid = served.tritonserver_pids()[0]
    body = json.dumps({"text_input": "x" * MAX_BODY, "max_tokens": 4}).encode()
    status, answer = post(served, "/v2/models/ensemble/generate", body)
    assert status == 413, answer
    assert f"larger than {MAX_BODY} bytes" in answer["error"]
    still_serving(served, triton_pid)


def test_ordinary_requests_pass_the_guard_unchanged(served):
    # Triton's own answers and errors come back as Triton gives them, nested data of a real rank included.
    status, answer = post(served, "/v2/models/ensemble/generate", b'{"text_input": [[["hi"]]], "max_tokens": 3}')
    assert status == 200 and answer["num_output_tokens"] == 3, answer
    with pytest.raises(RequestFailed, match="max_tokens must be in") as failure:
        generate(served.http_url, "hi", 0)
    assert failure.value.status == 400


def test_grpc_carries_the_same_text_without_parsing_it_as_json(served):
    # gRPC bodies are protobuf: the nested text is one string to Triton (refused by our preprocessing as longer
    # than the prompt bytes the model's context allows), never parsed as JSON, and the server is unharmed.
    triton_pid = served.tritonserver_pids()[0]
    stream = GrpcStream(served.grpc_url)
    try:
        with pytest.raises(RequestFailed, match="text_input is 120004 bytes; this server accepts at most"):
            list(stream.chunks(nested(DEPTH), 4, timeout_s=120))
        chunks = list(stream.chunks("hi", 2, timeout_s=120))
        assert chunks[-1]["num_output_tokens"] == 2
    finally:
        stream.close()
    still_serving(served, triton_pid)
