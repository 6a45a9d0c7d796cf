"""The pieces of the fault handling that need no server: the JSON depth scanner, the guard's choice of what
to scan, when the guard is needed, and the server's command line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dflash_trt.serving.http_guard import json_part
from dflash_trt.serving.json_depth import exceeds_depth, max_depth
from dflash_trt.serving.server_config import ServerConfig, needs_http_guard, server_command, triton_version


def reference_depth(value) -> int:
    """Depth of a parsed JSON value, by recursion (fine for the small documents made here)."""
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    return 0


def random_value(rng: random.Random, budget: int):
    kind = rng.randrange(6 if budget > 0 else 3)
    if kind == 0:
        # Strings full of what would change the depth if the scanner looked inside them.
        return rng.choice(['[', ']]]', '{"a": [', 'say \\"[\\" ', '\\\\', '"', 'plain'])
    if kind in (1, 2):
        return rng.choice([1, -2.5, True, None])
    if kind in (3, 4):
        return [random_value(rng, budget - 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["k", "[", "}"]) + str(i): random_value(rng, budget - 1) for i in range(rng.randrange(3))}


def test_max_depth_equals_the_parsed_depth_of_random_documents():
    rng = random.Random(7)
    for _ in range(2000):
        value = random_value(rng, rng.randrange(8))
        text = json.dumps(value).encode()
        assert max_depth(text) == reference_depth(value), text


@pytest.mark.parametrize("text, depth", [
    (b'{"a": "[[[[[["}', 1), (b'["\\"", [[]]]', 3), (b'["\\\\", [1]]', 2), (b'"{"', 0), (b"", 0), (b"[[1]", 2),
])
def test_brackets_inside_strings_and_escapes_do_not_count(text, depth):
    assert max_depth(text) == depth


def test_a_hostile_body_is_judged_without_recursion_and_stops_at_the_limit():
    deep = b"[" * 1_000_000 + b"]" * 1_000_000  # far beyond any recursion limit
    assert exceeds_depth(deep, 100)
    assert max_depth(deep, stop_above=100) == 101  # it stopped as soon as the limit was passed
    assert not exceeds_depth(b"[" * 100 + b"]" * 100, 100)
    flat = b"[" + b"[0]," * 100_000 + b"[0]]"  # many brackets, depth 2: scanned, not refused
    assert not exceeds_depth(flat, 100) and max_depth(flat) == 2


def test_only_the_json_header_of_a_binary_request_is_scanned():
    body = b'{"inputs": []}' + b"[" * 500
    assert json_part(body, {"Inference-Header-Content-Length": "14"}) == b'{"inputs": []}'
    assert json_part(body, {}) == body
    assert json_part(body, {"Inference-Header-Content-Length": "x"}) == body  # Triton refuses it; scan it all


def test_the_guard_is_on_for_triton_without_the_iterative_parser(tmp_path):
    home = Path(tmp_path)
    assert triton_version(home) is None
    assert needs_http_guard(ServerConfig(home), home)  # nvidia-pytriton's 2.51 ships no TRITON_VERSION
    (home / "TRITON_VERSION").write_text("2.68.0\n")
    assert needs_http_guard(ServerConfig(home), home)
    (home / "TRITON_VERSION").write_text("2.69.0\n")  # r26.05: common#156 (iterative JSON parsing)
    assert not needs_http_guard(ServerConfig(home), home)
    assert needs_http_guard(ServerConfig(home, http_guard=True), home)
    (home / "TRITON_VERSION").write_text("2.51.0")
    assert not needs_http_guard(ServerConfig(home, http_guard=False), home)


def test_behind_the_guard_triton_listens_on_a_private_loopback_port_with_its_own_shm_prefix():
    config = ServerConfig(Path("/repo"), http_port=8000, address="0.0.0.0", exit_timeout_s=105)
    command = server_command(config, Path("/t"), http_port=45678, shm_prefix="dflash_1_ab_")
    assert "--http-address=127.0.0.1" in command and "--http-port=45678" in command
    assert "--grpc-address=0.0.0.0" in command  # gRPC is protobuf: served directly
    assert "--backend-config=python,shm-region-prefix-name=dflash_1_ab_" in command
    assert "--exit-timeout-secs=105" in command
    plain = server_command(config, Path("/t"))
    assert "--http-address=0.0.0.0" in plain and "--http-port=8000" in plain


@pytest.fixture
def health_server():
    """The server's real health endpoints on a free loopback port, reporting whatever the test sets."""
    from dflash_trt.serving.health import HealthServer
    from dflash_trt.serving.server import free_ports

    state = {"live": True, "ready": True, "status": "serving", "problem": ""}
    (port,) = free_ports(1)
    server = HealthServer("127.0.0.1", port, lambda: dict(state)).start()
    yield state, f"http://127.0.0.1:{port}"
    server.close()


def get(url: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_health_endpoints_answer_the_supervisors_report(health_server):
    state, url = health_server
    assert get(url + "/health/ready")[0] == 200 and get(url + "/health/live")[0] == 200
    state.update(ready=False, status="unhealthy", problem="model process dflash_0_0 (pid 7) died")
    status, body = get(url + "/health/ready")
    assert status == 503 and body["problem"] == "model process dflash_0_0 (pid 7) died"
    assert get(url + "/health/live")[0] == 200  # restarting is alive
    state.update(live=False)
    assert get(url + "/health/live")[0] == 503
    assert get(url + "/v2/health/ready")[0] == 404


def test_the_gateway_health_asks_the_servers_model_aware_readiness(health_server):
    # Triton's readiness stays true when a model process died: the gateway's /health must not say ok then.
    import types

    from fastapi.testclient import TestClient

    from dflash_trt.gateway.app import create_app
    from dflash_trt.gateway.companion import gateway_command
    from dflash_trt.gateway.model import GatewayConfig

    state, url = health_server
    command = gateway_command(9000, 8001, "0.0.0.0", 300, health_port=8003)
    assert command[command.index("--server-health-url") + 1] == "http://127.0.0.1:8003/health/ready"
    state.update(ready=False, status="unhealthy", problem="model process dflash_0_0 (pid 7) died")
    config = GatewayConfig(triton_grpc="127.0.0.1:9", server_health_url=url + "/health/ready")
    with TestClient(create_app(config, types.SimpleNamespace(name="m", created=0))) as client:
        answer = client.get("/health")
    assert answer.status_code == 503
    assert "model process dflash_0_0 (pid 7) died" in answer.json()["error"]["message"]


def test_regions_of_a_supervisor_that_is_gone_are_removed_and_no_others(tmp_path):
    import os

    from dflash_trt.serving.model_processes import remove_stale_shm_regions, shm_prefix

    live_parent = os.getppid()  # a process that exists: its regions belong to a running server
    dead = 2**22 + 12345  # above any pid_max default: no such process
    names = [shm_prefix(live_parent, "0123abcd") + "a", shm_prefix(dead, "89abcdef") + "b",
             shm_prefix(4242, "deadbeef") + "c", "triton_python_backend_shm_region_x", "dflash_1_2_other"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = {p.name for p in remove_stale_shm_regions(tmp_path, own_pid=4242)}
    # Ours by pid (reused after a container restart) and the dead one's go; a live server's and others stay.
    assert removed == {names[1], names[2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names[0], names[3], names[4]])
