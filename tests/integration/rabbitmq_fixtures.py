"""RabbitMQ for the integration tests: a real RabbitMQ node (Debian's rabbitmq-server) started by
the test run on free 127.0.0.1 ports in a temp dir, with its own epmd, stopped afterwards; and a
consumer (pika, RabbitMQ's Python client) that reads a queue back completely. Import the fixture
into a test module:

    from rabbitmq_fixtures import rabbitmq, check_order, read_queue  # noqa: F401
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest

from conftest import free_ports, make_tls_files

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
EPMD = shutil.which("epmd") or "/usr/bin/epmd"


class RabbitServer:
    """One RabbitMQ node in its own directory, on its own AMQP, distribution and epmd ports.
    start() blocks until it accepts a login. kill() is SIGKILL (a crash); restart() starts it
    again on the same port with the same data (durable queues and persistent messages survive)."""

    def __init__(self, directory: Path, max_message_size: int = 1_048_576):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        # Chosen together, once: the AMQP, AMQPS, epmd and distribution ports must differ, and stay
        # the same across restarts.
        self.port, self.tls_port, self.epmd_port, self.dist_port = free_ports(4)
        # The AMQPS listener: a certificate for 127.0.0.1 from a CA of the test's; clients must
        # present a certificate of the same CA.
        self.tls = make_tls_files(self.dir / "tls")
        self.user = "relay"
        self.password = "rmq-" + uuid.uuid4().hex  # a secret the tests look for in the relay's logs
        self.max_message_size = max_message_size
        self.proc = None
        self.epmd = None

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.port}/"

    def tls_url(self, host="127.0.0.1") -> str:
        return f"amqps://{self.user}:{self.password}@{host}:{self.tls_port}/"

    def _env(self) -> dict:
        d = self.dir
        return {**os.environ,
                "HOME": str(d),  # the Erlang cookie
                "ERL_EPMD_PORT": str(self.epmd_port),
                "RABBITMQ_CONF_ENV_FILE": "/dev/null",  # not /etc/rabbitmq/rabbitmq-env.conf
                "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
                "RABBITMQ_NODENAME": f"outbox-it-{self.port}@localhost",
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
                "RABBITMQ_LOG_BASE": str(d / "log"),
                "RABBITMQ_LOGS": str(d / "log" / "rabbit.log"),
                "RABBITMQ_PID_FILE": str(d / "rabbit.pid")}

    def start(self, timeout=120.0):
        (self.dir / "enabled_plugins").write_text("[].\n")  # no management plugin: a faster boot
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"default_user = {self.user}\n"
            f"default_pass = {self.password}\n"
            "loopback_users = none\n"
            "disk_free_limit.absolute = 10MB\n"
            f"max_message_size = {self.max_message_size}\n"
            f"listeners.ssl.default = 127.0.0.1:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.tls['ca']}\n"
            f"ssl_options.certfile = {self.tls['cert']}\n"
            f"ssl_options.keyfile = {self.tls['key']}\n"
            "ssl_options.verify = verify_peer\n"
            "ssl_options.fail_if_no_peer_cert = true\n")
        if self.epmd is None or self.epmd.poll() is not None:
            # Our own epmd in the foreground: a node would otherwise start a daemon that outlives it.
            self.epmd = subprocess.Popen([EPMD, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc = subprocess.Popen([str(RABBITMQ_SERVER)], env=self._env(), cwd=self.dir,
                                     stdout=open(self.dir / "stdout.log", "a"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited {self.proc.returncode}: "
                                   f"{(self.dir / 'stdout.log').read_text()[-3000:]}")
            try:
                self.connection().close()
                return self
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rabbitmq-server did not accept a login within {timeout}s")
                time.sleep(0.25)

    def kill(self):
        """SIGKILL to the whole node (the start script, the Erlang VM and its helpers)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def restart(self):
        self.start()

    def log_tail(self, lines=40) -> str:
        """The node's own log, its last lines (for a failure's message)."""
        log = self.dir / "log" / "rabbit.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the start script stops the node cleanly
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.epmd and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait()

    def connection(self) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(host="127.0.0.1", port=self.port,
                                           credentials=pika.PlainCredentials(self.user, self.password),
                                           connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30)
        return pika.BlockingConnection(params)

    def declare(self, exchange: str, queue: str, binding_key: str, exchange_type="topic", queue_args=None):
        """A durable exchange and a durable queue bound to it."""
        conn = self.connection()
        try:
            ch = conn.channel()
            ch.exchange_declare(exchange, exchange_type=exchange_type, durable=True)
            ch.queue_declare(queue, durable=True, arguments=queue_args or {})
            ch.queue_bind(queue, exchange, routing_key=binding_key)
        finally:
            conn.close()


@dataclass
class Message:
    routing_key: str
    body: bytes
    message_id: str
    headers: dict = field(default_factory=dict)
    delivery_mode: int = 0
    content_type: str = ""
    timestamp: int = 0

    @property
    def outbox_id(self) -> int:
        return int(self.message_id)

    @property
    def key(self) -> str:
        return self.headers.get("outbox-key")


def read_queue(server: RabbitServer, queue: str, timeout: float = 60.0) -> list[Message]:
    """Every message in the queue as it is when called, in queue order (they are consumed)."""
    conn = server.connection()
    try:
        ch = conn.channel()
        expected = ch.queue_declare(queue, durable=True, passive=True).method.message_count
        ch.basic_qos(prefetch_count=2000)
        out = []
        deadline = time.monotonic() + timeout
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=1.0):
            if method is not None:
                headers = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (props.headers or {}).items()}
                out.append(Message(method.routing_key, body, props.message_id, headers, props.delivery_mode or 0,
                                   props.content_type or "", props.timestamp or 0))
            if len(out) >= expected:
                break
            assert time.monotonic() < deadline, f"reading {queue} timed out at {len(out)} of {expected}"
        ch.cancel()
        return out
    finally:
        conn.close()


def check_order(messages: list[Message]) -> dict:
    """Per key, the first occurrence of each event id must come in increasing id order (queue
    order is the order a consumer sees). Returns {"duplicates": n, "ids": set(...)}."""
    seen = set()
    last = {}
    duplicates = 0
    for m in messages:
        oid = m.outbox_id
        if oid in seen:
            duplicates += 1
            continue
        seen.add(oid)
        assert oid > last.get(m.key, 0), f"key {m.key}: id {oid} arrived after {last[m.key]}"
        last[m.key] = oid
    return {"duplicates": duplicates, "ids": seen}


@pytest.fixture(scope="module")
def rabbitmq():
    """One node for a test module. Tests use exchanges and queues of their own; a test that kills
    the node restarts it before it ends."""
    base = Path(tempfile.mkdtemp(prefix="outbox-rabbitmq-"))
    server = RabbitServer(base / "node")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
