"""The door of the registry that plays ECR: an HTTP proxy on 127.0.0.1 that lets a request through to
docker-registry only when `check` finds nothing to refuse, and answers the refusal otherwise.

docker-registry knows one htpasswd user; ECR knows who asked for each token. `check` (the AWS limits
layer's `ECRLimits.registry_refusal` in local mode) decides each request from its `Authorization`
header, method and path; a request it lets through goes on with the registry's own user. Bodies are
streamed both ways, so blob downloads cost a copy, not their size in memory.
"""

from __future__ import annotations

import base64
import http.client
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol, Self

from prewarm_devtools.node.process import LoopbackEndpoint
from prewarm_devtools.node.throttle import ByteBucket

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024
# Not forwarded: they describe one connection, not the message (RFC 9110, 7.6.1).
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                         "upgrade", "proxy-authorization", "proxy-authenticate"})


class Refusal(Protocol):
    """What to answer instead of serving: a status and a body (ECR's `{"errors": [...]}`)."""

    @property
    def status(self) -> int: ...

    def body(self) -> bytes: ...


#: (Authorization header or None, method, path) → the refusal, or None to serve the request.
Check = Callable[[str | None, str, str], Refusal | None]


class RegistryFront(LoopbackEndpoint):
    """Serves on its own 127.0.0.1 port what the registry at `upstream_port` serves, to requests `check`
    lets through, authenticating upstream as `upstream_auth` (user, password). `realm` is the host a
    401's `WWW-Authenticate: Basic` challenge names, as ECR's names its registry."""

    def __init__(self, upstream_port: int, upstream_auth: tuple[str, str], check: Check, *, realm: str) -> None:
        self.upstream_port = upstream_port
        #: The cap on bytes served per second, all requests together: none until `set_rate` sets one.
        self.bandwidth = ByteBucket(None)
        self._upstream_authorization = "Basic " + base64.b64encode(":".join(upstream_auth).encode()).decode()
        self.check = check
        self.realm = realm
        #: The latest refusals, (method, path, status, body), for tests and failure messages.
        self.refused: deque[tuple[str, str, int, bytes]] = deque(maxlen=200)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, port: int = 0) -> Self:
        front = self

        class Handler(_ProxyHandler):
            pass

        Handler.front = front
        self._server = _QuietServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"registry-front-{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietServer(ThreadingHTTPServer):
    """Clients that hang up (containerd after a 429 or a cancel) are logged at debug, not printed."""

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("registry front: %s hung up", client_address)
        else:
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _ProxyHandler(BaseHTTPRequestHandler):
    front: RegistryFront
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("registry front: " + format, *args)

    def do_GET(self) -> None:
        self._serve()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _serve(self) -> None:
        front = self.front
        refusal = front.check(self.headers.get("Authorization"), self.command, self.path)
        if refusal is not None:
            self._drain_body()
            self._refuse(refusal)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", front.upstream_port, timeout=120)
        try:
            self._forward(upstream)
        except (OSError, http.client.HTTPException) as e:
            log.warning("registry front: %s %s failed upstream: %s", self.command, self.path, e)
            self.close_connection = True
        finally:
            upstream.close()

    def _refuse(self, refusal: Refusal) -> None:
        body = refusal.body()
        self.front.refused.append((self.command, self.path, refusal.status, body))
        self.send_response(refusal.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        retry_after = getattr(refusal, "retry_after", None)
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if refusal.status == 401:
            self.send_header("WWW-Authenticate", f'Basic realm="https://{self.front.realm}/",service="ecr.amazonaws.com"')
        self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _drain_body(self) -> None:
        remaining = int(self.headers.get("Content-Length") or 0)
        while remaining > 0:
            got = self.rfile.read(min(_CHUNK, remaining))
            if not got:
                break
            remaining -= len(got)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True  # its body is not read: the connection cannot carry another request

    def _forward(self, upstream: http.client.HTTPConnection) -> None:
        chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
        upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in _HOP_BY_HOP and name.lower() != "authorization":
                upstream.putheader(name, value)
        upstream.putheader("Authorization", self.front._upstream_authorization)
        if chunked:
            upstream.putheader("Transfer-Encoding", "chunked")
        upstream.endheaders()
        if chunked:
            self._copy_chunked_body(upstream)
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining > 0:
                got = self.rfile.read(min(_CHUNK, remaining))
                if not got:
                    raise ConnectionError("the client closed before sending its whole body")
                upstream.send(got)
                remaining -= len(got)
        response = upstream.getresponse()
        self.send_response_only(response.status, response.reason)
        length = response.getheader("Content-Length")
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        has_body = self.command != "HEAD" and response.status not in (204, 304) and not 100 <= response.status < 200
        if has_body and length is None:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not has_body:
            return
        while chunk := response.read(_CHUNK):
            self._paced_wait(len(chunk))
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if length is None else chunk)
        if length is None:
            self.wfile.write(b"0\r\n\r\n")

    def _paced_wait(self, count: int) -> None:
        """Holds `count` bytes back until the front's byte cap lets them through."""
        bandwidth = self.front.bandwidth
        while bandwidth.available() <= 0:
            time.sleep(0.01)
        bandwidth.spend(count)

    def _copy_chunked_body(self, upstream: http.client.HTTPConnection) -> None:
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                upstream.send(b"0\r\n\r\n")
                return
            data = self.rfile.read(size)
            self.rfile.readline()
            upstream.send(b"%x\r\n%s\r\n" % (len(data), data))
