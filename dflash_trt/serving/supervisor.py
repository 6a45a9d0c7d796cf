"""`dflash-trt serve`'s supervision of a TritonServer: run it in the foreground, watch its processes, restart it
when one dies (Triton neither notices nor restarts a dead Python model process), drain on SIGTERM, and serve the
model-aware health endpoints from that state (health.py)."""

from __future__ import annotations

import signal
import threading

from dflash_trt.serving import model_processes as procs
from dflash_trt.serving.server import ServerConfig, TritonServer
from dflash_trt.serving.triton_home import ServerError


class Supervisor:
    """The state behind the health endpoints: which server runs, and in which phase."""

    def __init__(self):
        self.server: TritonServer | None = None
        self.phase = "starting"  # starting, serving, restarting, draining, failed
        self.last_failure = ""
        self.restarts = 0

    def report(self) -> dict:
        server = self.server
        problem = server.check() if server is not None and self.phase == "serving" else None
        ready = self.phase == "serving" and problem is None and server.is_ready()
        return {
            "live": self.phase != "failed",
            "ready": ready,
            "status": self.phase if problem is None else "unhealthy",
            "problem": problem or "",
            "last_failure": self.last_failure,
            "restarts": self.restarts,
            "model_processes": {p.instance: procs.is_running(p) for p in (server.model_processes if server else [])},
        }


# How often serve_forever checks the server's processes.
WATCH_INTERVAL_S = 0.5


def serve_forever(config: ServerConfig) -> int:
    """Run the server in the foreground until SIGINT/SIGTERM; return the process exit status.

    A server whose tritonserver or model process dies is killed at once (requests in flight fail) and
    started again, at most `max_restarts` times; after that ServerError (exit status 2 of the CLI), so
    that a container exits and its orchestrator restarts it."""
    state = Supervisor()
    stop = threading.Event()

    def _on_signal(signum, _frame):
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    health = None
    for path in procs.remove_stale_shm_regions():
        print(f"removed {path}: left behind by a server that was killed", flush=True)
    try:
        if config.health_port is not None:
            from dflash_trt.serving.health import HealthServer

            try:
                health = HealthServer(config.address, config.health_port, state.report).start()
            except OSError as error:
                raise ServerError(f"cannot serve the health endpoints on {config.address}:{config.health_port}: "
                                  f"{error}") from None
        while True:
            server = state.server = TritonServer(config)
            server.start()
            try:
                server.wait_ready(cancel=stop)
            except ServerError:
                if stop.is_set():
                    return 0  # asked to stop while loading: not a failure
                raise
            state.phase = "serving"
            print(server.describe(), flush=True)
            failure = None
            while not stop.is_set() and failure is None:
                stop.wait(WATCH_INTERVAL_S)
                failure = server.check()
            if failure is None:
                state.phase = "draining"
                print(f"stopping tritonserver (draining for up to {config.exit_timeout_s} s) ...", flush=True)
                server.stop()
                return 0
            state.phase, state.last_failure = "restarting", failure
            print(f"error: {failure}; stopping the server so that requests in flight fail", flush=True)
            server.kill()
            if state.restarts >= config.max_restarts:
                state.phase = "failed"
                raise ServerError(server._failure(f"{failure} (after {state.restarts} restart(s) of "
                                                  f"{config.max_restarts} allowed)"))
            state.restarts += 1
            print(f"restarting tritonserver ({state.restarts} of {config.max_restarts}) ...", flush=True)
    finally:
        if state.server is not None:
            state.server.stop()
        if health is not None:
            health.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
