"""Model-aware health endpoints of `dflash-trt serve`, for probes and load balancers.

Triton's own /v2/health/ready stays 200 when a model's Python process has died (server#8604, #7862).
The supervisor knows better: it watches tritonserver and every model process. It answers on its own port:

    GET /health/live   200 while the supervisor is serving or recovering (restarting a dead server)
    GET /health/ready  200 only when tritonserver answers ready and every model process it started is alive

Both answer JSON with the details (`status`, `reason`, the model processes). A plain thread-per-request
server from the standard library: probes are rare and tiny.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

LIVE_PATH = "/health/live"
READY_PATH = "/health/ready"


class HealthServer:
    """Serves `report()` (a dict with booleans `live` and `ready`) on host:port in a daemon thread."""

    def __init__(self, host: str, port: int, report: Callable[[], dict]):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the standard library's spelling
                path = self.path.split("?", 1)[0]
                if path not in (LIVE_PATH, READY_PATH):
                    self._answer(404, {"error": f"no such endpoint {path!r} (use {LIVE_PATH} or {READY_PATH})"})
                    return
                state = outer.report()
                ok = state["live"] if path == LIVE_PATH else state["ready"]
                self._answer(200 if ok else 503, state)

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # probes every few seconds: not worth a log line each
                pass

        self.report = report
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="health")

    def start(self) -> "HealthServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
