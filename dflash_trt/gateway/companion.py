"""The gateway as a companion process of `dflash-trt serve --openai-port PORT` (`make serve OPENAI_PORT=...`).

It starts at once and waits for Triton itself; it stops with the server (and dies with it, on Linux).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

ANY_ADDRESS = ("0.0.0.0", "")


def gateway_command(port: int, grpc_port: int, address: str, ready_timeout_s: float,
                    health_port: int | None = None) -> list[str]:
    """`dflash-trt openai` listening on `address`:`port`, calling Triton's gRPC port on the same machine (and
    asking the server's model-aware readiness on `health_port`, when it has one)."""
    triton_host = "127.0.0.1" if address in ANY_ADDRESS else address
    health = ["--server-health-url", f"http://{triton_host}:{health_port}/health/ready"] if health_port else []
    return [sys.executable, "-m", "dflash_trt.cli", "openai", "--triton-grpc", f"{triton_host}:{grpc_port}",
            "--host", address, "--port", str(port), "--ready-timeout", f"{ready_timeout_s:g}", *health]


@contextmanager
def gateway_beside(port: int | None, grpc_port: int, address: str, ready_timeout_s: float,
                   health_port: int | None = None) -> Iterator[None]:
    """Run the gateway for the duration of the block; no-op when port is None.

    The gateway has a session of its own: a stop signal sent to the server's process group (Ctrl-C, a
    container's SIGTERM) must not end it while the server drains the streams it relays; it stops after."""
    if port is None:
        yield
        return
    process = subprocess.Popen(gateway_command(port, grpc_port, address, ready_timeout_s, health_port),
                               stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, start_new_session=True)
    try:
        yield
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _die_with_parent() -> None:
    """In the child: SIGTERM when the server launcher dies, so no gateway outlives it (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
