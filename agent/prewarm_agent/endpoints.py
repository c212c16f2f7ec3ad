"""The agent's HTTP endpoints: `/healthz` (alive), `/readyz` (runtime answers, last receive did), `/metrics`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Check = Callable[[], str | None]


class OpsServer:
    """Serves the probes and metrics on `address`:`port` (port 0 picks a free one, see `port`).

    Each check returns None when healthy, else the reason, which the probe answers with a 503.
    """

    def __init__(
        self, address: str, port: int, *, healthy: Check, ready: Check, registry: CollectorRegistry
    ) -> None:
        routes = {"/healthz": healthy, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in routes:
                    problem = routes[path]()
                    self._answer(503 if problem else 200, f"{problem or 'ok'}\n".encode(), "text/plain")
                else:
                    self._answer(404, b"not found: try /healthz, /readyz or /metrics\n", "text/plain")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        # A short poll interval keeps `stop()` quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="agent-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
