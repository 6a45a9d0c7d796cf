"""Start, watch and stop a real tritonserver on loopback.

`TritonServer` is used both by `dflash-trt serve` (foreground until SIGINT/SIGTERM) and by the
test fixture (context manager on free ports). Readiness is always awaited with a timeout: a Python
stub that cannot start leaves the server "loading" forever, so the launcher watches the log for
load failures and reports the model's own error instead of hanging.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.serving.admin_apis import admin_key_from_env, restricted_api_options
from dflash_trt.serving.triton_home import ServerError, install_python_stub, server_env, triton_home

_MODEL_FAILURE = re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$", re.MULTILINE)
_LOAD_FAILURE = re.compile(r"failed to load|UNAVAILABLE: Internal|Stub process .* is not healthy|Traceback")


@dataclass
class ServerConfig:
    """How to run tritonserver. Ports 0 are not allowed: Triton needs fixed ports."""

    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = "127.0.0.1"
    ready_timeout_s: float = 300.0
    exit_timeout_s: int = 10
    log_verbose: int = 0
    log_path: Path | None = None
    echo: bool = False
    # Words before tritonserver: () or `mpirun --allow-run-as-root -n 1 [trtllm-llmapi-launch]` (launcher.py)
    launcher: tuple[str, ...] = ()
    # The admin key that opens Triton's restricted APIs (admin_apis.py); None: its variable, else a random key.
    admin_key: str | None = None

    @property
    def http_url(self) -> str:
        return f"http://{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{self.metrics_port}/metrics"


def server_command(config: ServerConfig, home: Path) -> list[str]:
    return [
        *config.launcher,
        str(home / "bin" / "tritonserver"),
        f"--model-repository={Path(config.model_repository).resolve()}",
        f"--backend-directory={home / 'backends'}",
        f"--http-address={config.address}",
        f"--http-port={config.http_port}",
        f"--grpc-address={config.address}",
        f"--grpc-port={config.grpc_port}",
        f"--metrics-address={config.address}",
        f"--metrics-port={config.metrics_port}",
        "--allow-gpu-metrics=false",
        f"--exit-timeout-secs={config.exit_timeout_s}",
        f"--log-verbose={config.log_verbose}",
        *restricted_api_options(config.admin_key or admin_key_from_env()),
    ]


def load_errors(log: str) -> list[str]:
    """Lines of a server log that explain why a model did not load."""
    return [line for line in log.splitlines() if _LOAD_FAILURE.search(line)]


def explain_load_errors(log: str) -> list[str]:
    """One readable entry per model that failed to load (its error and traceback), else the raw lines."""
    explained = [f"model '{name}': " + message.replace("\\n", "\n").rstrip()
                 for name, message in _MODEL_FAILURE.findall(log)]
    return explained or load_errors(log)


class TritonServer:
    """A tritonserver child process with its log captured; usable as a context manager."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self._process: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._pump: threading.Thread | None = None

    @property
    def log(self) -> str:
        with self._lock:
            return "".join(self._lines)

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def start(self) -> "TritonServer":
        home = triton_home()
        install_python_stub(home)
        if self.config.launcher:
            from dflash_trt.serving.launcher import require_launcher

            require_launcher(list(self.config.launcher))
        repo = Path(self.config.model_repository)
        if not repo.is_dir():
            raise ServerError(f"model repository {repo} does not exist (render one with `make repo`)")
        self._process = subprocess.Popen(
            server_command(self.config, home),
            env=server_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the launcher only, which stops the server in order
            preexec_fn=_die_with_parent,
        )
        self._pump = threading.Thread(target=self._read_output, daemon=True)
        self._pump.start()
        return self

    def _read_output(self) -> None:
        log_file = open(self.config.log_path, "a", encoding="utf-8") if self.config.log_path else None
        try:
            for raw in iter(self._process.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                with self._lock:
                    self._lines.append(line)
                if log_file:
                    log_file.write(line)
                    log_file.flush()
                if self.config.echo:
                    sys.stderr.write(line)
        finally:
            if log_file:
                log_file.close()

    def is_ready(self) -> bool:
        # A server bound to every interface is probed on loopback.
        host = "127.0.0.1" if self.config.address in ("0.0.0.0", "") else self.config.address
        url = f"http://{host}:{self.config.http_port}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_ready(self) -> None:
        """Block until /v2/health/ready answers 200; raise ServerError with the load error otherwise."""
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            if self.returncode is not None:
                self._join_pump()
                exited = "tritonserver exited with status %d" % self.returncode
                # Triton may exit on a failed load before the pump has shown us the error: name it all the same.
                raise ServerError(self._failure(f"a model failed to load ({exited})" if load_errors(self.log) else exited))
            if load_errors(self.log):
                self._await_load_failure(deadline)
                self.stop()
                raise ServerError(self._failure("a model failed to load"))
            if self.is_ready():
                return
            time.sleep(0.25)
        self.stop()
        raise ServerError(self._failure(f"tritonserver not ready after {self.config.ready_timeout_s:.0f} s"))

    def _await_load_failure(self, deadline: float) -> None:
        """After the first sign of a failed load, wait (however slow the machine) until Triton has named the
        model and its error, or has exited, so the report says which model failed and why."""
        while time.monotonic() < deadline and self._process.poll() is None and not _MODEL_FAILURE.search(self.log):
            time.sleep(0.25)
        if self._process.poll() is not None:
            self._join_pump()  # the rest of the log, up to the exit

    def _failure(self, headline: str) -> str:
        errors = explain_load_errors(self.log)
        detail = "\n".join(errors) if errors else "\n".join(self.log.splitlines()[-30:])
        return f"{headline}\n{detail}"

    def stop(self) -> int | None:
        """SIGTERM (graceful: Triton finishes in-flight requests), then SIGKILL after a grace period."""
        if self._process is None:
            return None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=self.config.exit_timeout_s + 10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._join_pump()
        return self._process.returncode

    def _join_pump(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)

    def __enter__(self) -> "TritonServer":
        if self._process is None:  # serve_on_free_ports hands over a server that is already up
            self.start()
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> str:
        c = self.config
        return (
            f"Triton is ready: HTTP {c.http_url}  gRPC {c.grpc_url}  metrics {c.metrics_url}\n"
            f"  models from {Path(c.model_repository).resolve()}"
        )


def serve_forever(config: ServerConfig) -> int:
    """Run the server in the foreground until SIGINT/SIGTERM; return the process exit status."""
    server = TritonServer(config)
    stop = threading.Event()

    def _on_signal(signum, _frame):
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        server.wait_ready()
        print(server.describe(), flush=True)
        while not stop.is_set() and server.returncode is None:
            stop.wait(0.5)
        if server.returncode is not None:
            raise ServerError(server._failure(f"tritonserver exited with status {server.returncode}"))
        print("stopping tritonserver ...", flush=True)
        server.stop()
        return 0
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def serve_on_free_ports(model_repository: Path, attempts: int = 3, **overrides) -> TritonServer:
    """A ready server on free loopback ports (use it as a context manager to stop it).

    A port can be taken by another process between asking the OS for it and tritonserver binding it;
    the server then fails at once with "already in use", and another set of ports is tried.
    """
    for attempt in range(attempts):
        http, grpc, metrics = free_ports(3)
        server = TritonServer(ServerConfig(model_repository, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                           **overrides))
        try:
            server.start()
            server.wait_ready()
            return server
        except ServerError as error:
            server.stop()
            if "already in use" not in str(error) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def free_ports(count: int) -> list[int]:
    """Ports free on loopback right now (tritonserver needs fixed ports: ask the OS, then release them)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    """In the child: receive SIGTERM if the launcher dies, so no server outlives it (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
