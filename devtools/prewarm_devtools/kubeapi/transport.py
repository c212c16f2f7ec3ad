"""The HTTP/1.1 transport of the embedded API server: a threaded server on 127.0.0.1 (plain, or TLS with
the handshake in each connection's own thread), keep-alive, chunked request bodies, `Warning` headers,
and chunked streaming for watches that ends when the client goes away. What a request means is the
`Answering` object's business (server.py)."""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.store import dumps

log = logging.getLogger(__name__)

JSON = "application/json"


class Answering(Protocol):
    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> Response:
        """Answer one request."""
        ...


# Seconds a TLS client has to finish its handshake.
_HANDSHAKE_TIMEOUT = 10.0


@dataclass
class Response:
    """An answer: a body, or a stream of watch lines (None now and then, to check the client is there)."""

    code: int
    body: bytes = b""
    content_type: str = JSON
    stream: Iterator[bytes | None] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # Benchmarks open many connections at once; the default backlog of 5 would refuse some.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], api: Answering,
                 tls: ssl.SSLContext | None = None) -> None:
        self.api = api
        self.tls = tls
        self._live: dict[socket.socket, threading.Thread] = {}
        self._handler_threads: set[threading.Thread] = set()
        self._live_lock = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        if self.tls is None:
            return connection, address
        # The handshake happens in the connection's own thread (`Handler.setup`): a slow or silent
        # client must not hold up the accept loop.
        return self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up mid-handshake (or probes with plain HTTP) is not a server failure.
        log.debug("connection from %s failed", client_address, exc_info=True)

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, known from the start so that stop() can close and join it.
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), name="kubeapi-connection", daemon=True
        )
        with self._live_lock:
            self._handler_threads = {t for t in self._handler_threads if t.is_alive()}
            self._handler_threads.add(thread)
            self._live[request] = thread
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self._live_lock:
            self._live.pop(request, None)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._live_lock:
            connections = list(self._live)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("connection already closed", exc_info=True)

    def join_handlers(self, timeout: float) -> None:
        with self._live_lock:
            threads = list(self._handler_threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver"
    sys_version = ""
    server: HttpServer

    def setup(self) -> None:
        # Headers and body go in separate writes: without NODELAY, Nagle would delay the body.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(_HANDSHAKE_TIMEOUT)
            self.request.do_handshake()  # failures go to HttpServer.handle_error
            self.request.settimeout(None)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            log.debug("client went away before the response was flushed", exc_info=True)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_OPTIONS(self) -> None:
        self._serve("OPTIONS")

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self, method: str) -> None:
        try:
            body = self._read_body()
            response = self.server.api.handle(method, self.path, self.headers, body)
        except Exception:
            log.exception("the embedded API server failed on %s %s", method, self.path)
            response = Response(
                500, dumps(errors.internal_error("unexpected server error; see the server log").status())
            )
        try:
            if response.stream is not None:
                self._stream(response.stream)
            else:
                self._send(response)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    def _start(self, response: Response) -> None:
        self.send_response(response.code)
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Content-Type", response.content_type)
        for name, value in response.headers.items():
            self.send_header(name, value)
        for warning in response.warnings:
            self.send_header("Warning", '299 - "' + warning.replace("\\", "\\\\").replace('"', '\\"') + '"')

    def _send(self, response: Response) -> None:
        self._start(response)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def _stream(self, stream: Iterator[bytes | None]) -> None:
        self._start(Response(200))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for line in stream:
                if line is None:
                    if self._client_gone():
                        self.close_connection = True
                        return
                    continue
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            # The client closed the watch (or the server is stopping): nothing more to send.
            self.close_connection = True
        except Exception:
            # Headers are out: the only way left to report a failure is to cut the stream.
            log.exception("the embedded API server failed while streaming %s", self.path)
            self.close_connection = True

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            if not isinstance(self.connection, ssl.SSLSocket):
                return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
            # An SSLSocket cannot peek, and TLS 1.3 hides a close_notify among application data:
            # read what came. A watch's client sends nothing while it watches, so that is its
            # close_notify or end of stream (b""), or a request it should not have pipelined,
            # which ends the watch as well.
            self.connection.setblocking(False)
            try:
                self.connection.recv(1)
            except ssl.SSLWantReadError:
                return False  # part of a record, or a post-handshake message TLS handled itself
            finally:
                self.connection.setblocking(True)
            return True
        except OSError:
            return True
