"""tritonserver always starts with its admin APIs (logging, trace, shared memory, model repository) restricted to
a key; tests/faults/test_input_round_trips.py checks on the real server that they refuse requests without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_trt.serving.admin_apis import ADMIN_KEY_ENV
from dflash_trt.serving.server_config import ServerConfig, server_command
from dflash_trt.serving.triton_home import ServerError


def restriction_flags(command: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in command if "restricted" in arg)


def test_the_admin_apis_are_restricted_to_the_configured_key(monkeypatch):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    flags = restriction_flags(server_command(ServerConfig(Path("/repo"), admin_key="k3y"), Path("/t")))
    setting = "shared-memory,logging,trace,model-repository:dflash-admin-key=k3y"
    assert flags == {"http-restricted-api": setting, "grpc-restricted-protocol": setting}


def test_the_key_comes_from_the_environment_else_a_random_one(monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, "from-env")
    assert restriction_flags(server_command(ServerConfig(Path("/r")), Path("/t")))["http-restricted-api"].endswith(
        "=from-env")
    monkeypatch.delenv(ADMIN_KEY_ENV)
    keys = {restriction_flags(server_command(ServerConfig(Path("/r")), Path("/t")))["http-restricted-api"]
            for _ in range(2)}
    assert len(keys) == 2  # unset: a fresh random key per start, so nobody can use the APIs


def test_a_key_that_would_break_the_flag_is_refused(monkeypatch):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    with pytest.raises(ServerError, match="letters, digits"):
        server_command(ServerConfig(Path("/r"), admin_key="a=b,c"), Path("/t"))
