"""A real HTTP(S) webhook receiver on 127.0.0.1 for the webhook sink's integration tests.

Each request is recorded (arrival time, headers, body, the answer given); a `behaviour` callable
decides the answer per request. HTTP/1.1 with keep-alive, one thread per connection, accepted
connections counted. HTTPS uses a self-signed certificate made with the openssl CLI at test time.
"""
from __future__ import annotations

import base64
import dataclasses
import http.server
import os
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict = dataclasses.field(default_factory=dict)
    delay: float = 0.0   # seconds to wait before answering
    stall: float = 0.0   # > 0: wait this long, then close the connection without any answer


@dataclasses.dataclass
class Request:
    seq: int                 # arrival order
    arrived: float           # time.monotonic()
    wall: float              # time.time()
    connection: int          # which accepted connection carried it
    headers: dict            # lower-cased names
    body: bytes
    status: Optional[int] = None   # the status sent; None while pending or when stalled
    ack_seq: Optional[int] = None  # order in which 2xx answers were decided
    answered: float = 0.0          # time.monotonic() when the answer was written

    @property
    def event_id(self) -> int:
        return int(self.headers.get("webhook-id", "0"))


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "webhook-test-receiver"

    def setup(self):
        owner = self.server.owner
        self.connection_no = owner._new_connection()
        if owner.ssl_context is not None:
            self.request.settimeout(10)
            try:
                self.request = owner.ssl_context.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError):
                owner._tls_failure()
                raise
            self.request.settimeout(None)
        super().setup()

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        owner = self.server.owner
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length) if length else b""
        req = owner._record(self.connection_no, {k.lower(): v for k, v in self.headers.items()}, body)
        reply = owner.behaviour(req) if owner.behaviour else Reply()
        if reply.delay:
            time.sleep(reply.delay)
        if reply.stall:
            time.sleep(reply.stall)
            self.close_connection = True
            return
        owner._answered(req, reply.status)
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # TLS handshake failures and client disconnects are counted, not printed


class Receiver:
    def __init__(self, behaviour: Optional[Callable[[Request], Reply]] = None, ssl_context=None):
        self.behaviour = behaviour
        self.ssl_context = ssl_context
        self.requests: list[Request] = []
        self.connections = 0
        self.tls_failures = 0
        self._lock = threading.Lock()
        self._seq = 0
        self._ack = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}/hooks"

    def start(self) -> "Receiver":
        self._thread.start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    # -- recording (handler threads) --
    def _new_connection(self) -> int:
        with self._lock:
            self.connections += 1
            return self.connections

    def _tls_failure(self):
        with self._lock:
            self.tls_failures += 1

    def _record(self, connection, headers, body) -> Request:
        with self._lock:
            self._seq += 1
            req = Request(self._seq, time.monotonic(), time.time(), connection, headers, body)
            self.requests.append(req)
            return req

    def _answered(self, req: Request, status: int):
        with self._lock:
            req.status = status
            req.answered = time.monotonic()
            if 200 <= status < 300:
                self._ack += 1
                req.ack_seq = self._ack

    # -- queries (test thread) --
    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def acked_ids(self) -> set[int]:
        return {r.event_id for r in self.snapshot() if r.ack_seq is not None}

    def requests_for(self, event_id: int) -> list[Request]:
        return [r for r in self.snapshot() if r.event_id == event_id]

    def in_flight(self) -> int:
        return sum(1 for r in self.snapshot() if r.status is None)


def make_self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost and its key, made by the openssl CLI."""
    cert, key = directory / "receiver-cert.pem", directory / "receiver-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


def server_tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


@pytest.fixture
def receivers():
    """Factory: receivers(behaviour=None, ssl_context=None) starts a receiver; all stop at teardown."""
    started = []

    def start(behaviour=None, ssl_context=None):
        r = Receiver(behaviour, ssl_context).start()
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def new_secret() -> str:
    """A fresh Standard Webhooks secret, whsec_<base64 of 32 random bytes>."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def webhook_sink(url: str, name: str = "hooks", **settings) -> dict:
    return {"name": name, "type": "webhook", "url": url, **settings}
