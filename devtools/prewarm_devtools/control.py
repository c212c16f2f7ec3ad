"""The running local stack's control channel: JSON over HTTP on 127.0.0.1, for `prewarm local ...`.

The stack serves it on a free port and writes its URL and a random bearer token into the state file
(readable by its owner only): `LOCAL_CONTROL_URL`, `LOCAL_CONTROL_TOKEN`. Requests run one at a time on
one long-lived worker thread, so the processes they start (containerd, agents) outlive the request
and still die with the stack (their death signal follows the thread that started them).

    GET    /status                       endpoints, nodes and their agents
    POST   /fire        {"schedule": "repull"|"sweep"|"refresh"|"sync"|"bakes"}
    POST   /nodes       {"name": ..., "labels": {...}, "taints": [...], "agent": true}
    DELETE /nodes/NAME
    POST   /agents/NODE/stop|kill|start

An answer is a JSON object; a refusal is `{"error": "..."}` with status 400 (or 404, 401).
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ControlError(RuntimeError):
    """A control request was refused or the stack did not answer; the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ControlServer:
    """Serves `routes(method, parts, body)` on 127.0.0.1 with a bearer token: `parts` are the path's
    segments, `body` the request's JSON object; a route raises `ControlError` to refuse."""

    def __init__(self, routes: Callable[[str, list[str], dict[str, Any]], dict[str, Any]]) -> None:
        self.routes = routes
        self.token = secrets.token_urlsafe(24)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-control")
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ControlServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _answer(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                if not secrets.compare_digest(self.headers.get("Authorization", ""), f"Bearer {server.token}"):
                    self._answer(401, {"error": "wrong or missing token (read from the state file)"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._answer(400, {"error": "the request body is not JSON"})
                    return
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                future = server._worker.submit(server.routes, self.command, parts, body)
                try:
                    self._answer(200, future.result())
                except ControlError as e:
                    self._answer(e.status, {"error": str(e)})
                except Exception as e:  # noqa: BLE001 - the caller gets the failure; the stack keeps serving
                    self._answer(500, {"error": f"{type(e).__name__}: {e}"})

            do_GET = do_POST = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-control-http", daemon=True)
        self._thread.start()
        return self

    def run(self, fn: Callable[[], Any]) -> Any:
        """Runs `fn` on the worker thread (where processes meant to outlive a request are started)."""
        return self._worker.submit(fn).result()

    def stop_serving(self) -> None:
        """Takes no more requests, and returns once the one in flight (if any) has finished."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._worker.submit(lambda: None).result()

    def stop(self) -> None:
        """Stops serving and ends the worker thread: stop what it started first (it dies with the thread)."""
        self.stop_serving()
        self._worker.shutdown(wait=True)


class ControlClient:
    """Calls a running stack's control channel (URL and token from its state file)."""

    def __init__(self, url: str, token: str, timeout: float = 180.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read() or b"{}").get("error") or str(e)
            except ValueError:
                message = str(e)
            raise ControlError(message, e.code) from e
        except (urllib.error.URLError, OSError) as e:
            raise ControlError(f"the local stack's control channel at {self.url} does not answer: "
                               f"{getattr(e, 'reason', e)}", 503) from e
