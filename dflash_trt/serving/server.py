"""Start, watch and stop a real tritonserver on loopback.

`TritonServer` is used both by `dflash-trt serve` (foreground until SIGINT/SIGTERM) and by the
test fixture (context manager on free ports). Readiness is always awaited with a timeout: a Python
stub that cannot start leaves the server "loading" forever, so the launcher watches the log for
load failures and reports the model's own error instead of hanging.

Faults it survives:
- hostile HTTP bodies: a Triton older than 2.69 serves HTTP on a private loopback port behind the guarding
  front (http_guard.py), which owns the public HTTP port;
- a dead model process: once ready, the model processes are recorded and checked (model_processes.py);
  `check()` names one that died, `kill()` ends the server at once so in-flight requests fail instead of
  hanging, and `serve_forever` restarts it (or exits non-zero) while the health endpoints say so (health.py);
- shutdown: SIGTERM lets Triton drain in-flight requests for `exit_timeout_s`, then every process left in the
  server's process group is killed and the shared-memory regions of its Python backend (named by a prefix
  unique to this server) are removed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from dflash_trt.serving import model_processes as procs
from dflash_trt.serving.server_config import ServerConfig, needs_http_guard, server_command
from dflash_trt.serving.triton_home import ServerError, install_python_stub, server_env, triton_home

_MODEL_FAILURE = re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$", re.MULTILINE)
_LOAD_FAILURE = re.compile(r"failed to load|UNAVAILABLE: Internal|Stub process .* is not healthy|Traceback")


# Seconds past the drain before the server's processes are killed: Triton's own exit after draining.
EXIT_MARGIN_S = 5


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
        self._guard: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._pump: threading.Thread | None = None
        self._guard_pump: threading.Thread | None = None
        # Unique per server: the Python backend's regions in /dev/shm start with it, so they can be cleaned up.
        self.shm_prefix = procs.shm_prefix(os.getpid(), uuid.uuid4().hex[:8])
        self.triton_http_port: int | None = None  # Triton's private port when the guard owns the public one
        self.model_processes: list[procs.ModelProcess] = []
        self._stub_parents: set[int] = set()
        self._ended = False

    @property
    def log(self) -> str:
        with self._lock:
            return "".join(self._lines)

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def guarded(self) -> bool:
        return self._guard is not None

    def start(self) -> "TritonServer":
        home = triton_home()
        install_python_stub(home)
        if self.config.launcher:
            from dflash_trt.serving.launcher import require_launcher

            require_launcher(list(self.config.launcher))
        repo = Path(self.config.model_repository)
        if not repo.is_dir():
            raise ServerError(f"model repository {repo} does not exist (render one with `make repo`)")
        if needs_http_guard(self.config, home):
            self.triton_http_port = free_ports(1)[0]
        self._process = subprocess.Popen(
            server_command(self.config, home, self.triton_http_port, self.shm_prefix),
            env=server_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: signals reach it only from here, and it can be killed whole
            preexec_fn=_die_with_parent,
        )
        self._pump = threading.Thread(target=self._read_output, args=(self._process,), daemon=True)
        self._pump.start()
        if self.triton_http_port is not None:
            self._start_guard()
        return self

    def _start_guard(self) -> None:
        c = self.config
        self._guard = subprocess.Popen(
            [sys.executable, "-m", "dflash_trt.serving.http_guard", "--listen", f"{c.address}:{c.http_port}",
             "--upstream", f"127.0.0.1:{self.triton_http_port}", "--max-body-bytes", str(c.max_body_bytes),
             "--max-json-depth", str(c.max_json_depth)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # a stop signal to our group must not cut the streams it relays during the drain
            preexec_fn=_die_with_parent,
        )
        self._guard_pump = threading.Thread(target=self._read_output, args=(self._guard,), daemon=True)
        self._guard_pump.start()

    def _read_output(self, process: subprocess.Popen) -> None:
        log_file = open(self.config.log_path, "a", encoding="utf-8") if self.config.log_path else None
        try:
            for raw in iter(process.stdout.readline, b""):
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

    def wait_ready(self, cancel: threading.Event | None = None) -> None:
        """Block until /v2/health/ready answers 200; raise ServerError with the load error otherwise.

        Then record the model processes, which check() watches from now on."""
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            if self.returncode is not None:
                self._join_pump()
                exited = "tritonserver exited with status %d" % self.returncode
                # Triton may exit on a failed load before the pump has shown us the error: name it all the same.
                raise ServerError(self._failure(f"a model failed to load ({exited})" if load_errors(self.log) else exited))
            if self._guard is not None and self._guard.poll() is not None:
                self.stop()  # also reads the guard's last words (e.g. "address already in use") into the log
                raise ServerError(self._failure(f"the HTTP guard exited with status {self._guard.returncode}"))
            if load_errors(self.log):
                self._await_load_failure(deadline)
                self.stop()
                raise ServerError(self._failure("a model failed to load"))
            if cancel is not None and cancel.is_set():
                self.stop()
                raise ServerError("stopped before tritonserver was ready")
            if self.is_ready():
                self.model_processes = procs.model_processes(self._process.pid)
                self._stub_parents = {p for p in map(procs.parent_of, (m.pid for m in self.model_processes)) if p}
                return
            time.sleep(0.25)
        self.stop()
        raise ServerError(self._failure(f"tritonserver not ready after {self.config.ready_timeout_s:.0f} s"))

    def check(self) -> str | None:
        """None while tritonserver, the guard and every recorded model process run; else what died."""
        if self._process is None:
            return "tritonserver is not started"
        if self._process.poll() is not None:
            return f"tritonserver exited with status {self._process.returncode}"
        if self._guard is not None and self._guard.poll() is not None:
            return f"the HTTP guard exited with status {self._guard.returncode}"
        for process in self.model_processes:
            if not procs.is_running(process):
                return f"model process {process.instance} (pid {process.pid}) died"
        return None

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
        """Graceful: SIGTERM lets Triton drain in-flight requests for exit_timeout_s; whatever is left of the
        server's process group after that (a busy model process that ignored the signal) is killed; then the
        guard stops and the server's shared memory is removed."""
        return self._end(drain=True)

    def kill(self) -> int | None:
        """At once: SIGKILL to every process of the server, so that requests in flight fail now rather than
        wait for a model process that is gone; then the same clean-up as stop()."""
        return self._end(drain=False)

    def _end(self, drain: bool) -> int | None:
        if self._process is None:
            return None
        if self._ended:  # stopped already (a caller's clean-up path may ask again): nothing left to wait for
            return self._process.returncode
        if self._process.poll() is None:
            if drain:
                self._process.send_signal(signal.SIGTERM)
                try:
                    self._process.wait(timeout=self.config.exit_timeout_s + EXIT_MARGIN_S)
                except subprocess.TimeoutExpired:
                    self._say(f"tritonserver still running {self.config.exit_timeout_s + EXIT_MARGIN_S} s after "
                              "SIGTERM: killing its processes")
            procs.kill_group(self._process.pid)
            self._process.wait()
        # Members of its group that outlived tritonserver (orphaned model processes) go too.
        procs.kill_group(self._process.pid)
        self._stop_guard()
        self._join_pump()
        if self._pump is not None and self._pump.is_alive():  # a process outside the group holds the log pipe
            self._say("the server log is still open 5 s after tritonserver exited; not waiting for it")
        self._clean_up()
        self._ended = True
        return self._process.returncode

    def _say(self, message: str) -> None:
        """A line of our own in the server's log, shown on stderr even when the log is not echoed."""
        with self._lock:
            self._lines.append(f"dflash-trt: {message}\n")
        print(f"dflash-trt: {message}", file=sys.stderr, flush=True)

    def _stop_guard(self) -> None:
        if self._guard is None:
            return
        if self._guard.poll() is None:
            self._guard.terminate()
            try:
                self._guard.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._say("the HTTP guard still running 10 s after SIGTERM: killing it")
                self._guard.kill()
                self._guard.wait()
        if self._guard_pump is not None:
            self._guard_pump.join(timeout=5)

    def _clean_up(self) -> None:
        """Shared memory of the Python backend and the cancel board of this server's model processes."""
        procs.remove_shm_regions(self.shm_prefix)
        for parent in self._stub_parents | {self._process.pid}:
            shutil.rmtree(Path(tempfile.gettempdir()) / f"dflash-cancelled-{parent}", ignore_errors=True)

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
        guard = f" (guarded; Triton's own on 127.0.0.1:{self.triton_http_port})" if self.guarded else ""
        return (
            f"Triton is ready: HTTP {c.http_url}{guard}  gRPC {c.grpc_url}  metrics {c.metrics_url}\n"
            f"  models from {Path(c.model_repository).resolve()}"
        )


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
