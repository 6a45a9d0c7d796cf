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


def gateway_command(port: int, grpc_port: int, address: str, ready_timeout_s: float) -> list[str]:
    """`dflash-trt openai` listening on `address`:`port`, calling Triton's gRPC port on the same machine."""
    triton_host = "127.0.0.1" if address in ANY_ADDRESS else address
    return [sys.executable, "-m", "dflash_trt.cli", "openai", "--triton-grpc", f"{triton_host}:{grpc_port}",
            "--host", address, "--port", str(port), "--ready-timeout", f"{ready_timeout_s:g}"]


@contextmanager
def gateway_beside(port: int | None, grpc_port: int, address: str, ready_timeout_s: float) -> Iterator[None]:
    """Run the gateway for the duration of the block; no-op when port is None."""
    if port is None:
        yield
        return
    process = subprocess.Popen(gateway_command(port, grpc_port, address, ready_timeout_s),
                               stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
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
