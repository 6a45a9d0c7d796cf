"""`dflash-trt serve` as a subprocess, streams in threads, and what a server leaves behind.

Every wait is on a condition with a generous timeout (reached only when something is broken)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dflash_trt.serving import model_processes as procs
from dflash_trt.serving.cancellation import STEP_GATE_ENV
from dflash_trt.serving.client import GrpcStream, generate_stream
from dflash_trt.serving.server import free_ports

LOAD_TIMEOUT_S = 600.0  # loading the tiny models takes seconds alone, minutes on a busy 2-core machine


def wait_for(condition, what: str, timeout_s: float, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


class StepGate:
    """Holds the dflash model's decoding steps (after each request's first) while `hold` exists."""

    def __init__(self, directory: Path):
        self.directory = directory

    def hold(self) -> None:
        (self.directory / "hold").touch()

    def release(self) -> None:
        (self.directory / "hold").unlink(missing_ok=True)


class Served:
    """`dflash-trt serve` on free loopback ports with the health endpoints, its log in a file."""

    def __init__(self, repo: Path, workdir: Path, *args: str):
        self.http_port, self.grpc_port, self.metrics_port, self.health_port = free_ports(4)
        self.log_path = workdir / "serve.log"
        self.gate = StepGate(workdir / "gate")
        self.gate.directory.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "dflash_trt.cli", "serve", "--repo", str(repo),
                   "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                   "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port),
                   "--ready-timeout", str(int(LOAD_TIMEOUT_S)), "--quiet", "--log-file", str(workdir / "triton.log"),
                   *args]
        env = {**os.environ, STEP_GATE_ENV: str(self.gate.directory)}
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.process.pid

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        text = self.log_path.read_text()
        triton = self.log_path.parent / "triton.log"
        return text + ("\n--- triton log (end) ---\n" + "\n".join(triton.read_text().splitlines()[-40:])
                       if triton.is_file() else "")

    def health(self, which: str = "ready") -> tuple[int | None, dict]:
        """(status, body) of /health/<which>; (None, {}) when nothing answers."""
        url = f"http://127.0.0.1:{self.health_port}/health/{which}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
        except (urllib.error.URLError, OSError):
            return None, {}

    def wait_ready(self, timeout_s: float = LOAD_TIMEOUT_S) -> dict:
        def ready():
            if self.process.poll() is not None:
                pytest.fail(f"dflash-trt serve exited with {self.process.returncode}:\n{self.log()}")
            status, body = self.health()
            return body if status == 200 else None

        return wait_for(ready, "the server to be ready", timeout_s, poll_s=0.25)

    def in_flight(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("dflash_requests_in_flight{"))

    def tritonserver_pids(self) -> list[int]:
        return [pid for pid in procs.descendants(self.pid) if _comm(pid) == "tritonserver"]

    def model_process(self, model: str) -> procs.ModelProcess:
        (found,) = [p for p in procs.model_processes(self.pid) if p.instance.startswith(model + "_")]
        return found

    def shm_regions(self) -> set[str]:
        return {p.name for p in procs.shm_regions(f"dflash_{self.pid}_")}

    def stop(self, timeout_s: float = 180.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                procs.kill_group(self.pid)
                self.process.wait()
        self._log.close()
        return self.process.returncode


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of a process group."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                text = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Stream(threading.Thread):
    """One streaming request (HTTP SSE through the guard, or gRPC) run to its end in a thread.

    outcome: "complete" (a final chunk with a finish_reason), "error" (the server said it failed, or the
    connection broke), "timeout" (nothing came for read_timeout_s: the hang this suite must never see), or
    "cut" (the stream ended without a final chunk and without an error)."""

    def __init__(self, served: Served, kind: str, max_tokens: int, read_timeout_s: float = 120.0):
        super().__init__(daemon=True)
        self.served, self.kind, self.max_tokens, self.read_timeout_s = served, kind, max_tokens, read_timeout_s
        self.chunks: list[dict] = []
        self.outcome: str | None = None
        self.detail = ""
        self.ended_at: float | None = None

    def run(self) -> None:
        try:
            if self.kind == "http":
                source = generate_stream(self.served.http_url, "Tell me a story", self.max_tokens,
                                         timeout_s=self.read_timeout_s)
                for chunk in source:
                    self.chunks.append(chunk)
            else:
                stream = GrpcStream(self.served.grpc_url)
                try:
                    for chunk in stream.chunks("Tell me a story", self.max_tokens, timeout_s=self.read_timeout_s):
                        self.chunks.append(chunk)
                finally:
                    stream.close()
            final = bool(self.chunks) and bool(self.chunks[-1].get("finish_reason"))
            self.outcome = "complete" if final else "cut"
        except (TimeoutError, queue.Empty) as error:
            self.outcome, self.detail = "timeout", repr(error)
        except Exception as error:  # noqa: BLE001 - any failure the client sees is an error outcome
            self.outcome, self.detail = ("timeout", repr(error)) if "timed out" in str(error) else ("error", repr(error))
        finally:
            self.ended_at = time.monotonic()

    @property
    def tokens(self) -> int:
        return self.chunks[-1].get("num_output_tokens", 0) if self.chunks else 0


def start_streams(served: Served, count: int, max_tokens: int) -> list[Stream]:
    """`count` streams, HTTP and gRPC alternately, all inside the dflash model (the gate holds its steps)."""
    streams = [Stream(served, "http" if i % 2 == 0 else "grpc", max_tokens) for i in range(count)]
    for stream in streams:
        stream.start()
    wait_for(lambda: served.in_flight() >= count, f"{count} streams in flight", timeout_s=120)
    return streams
