"""Issue 46, part 4: `outbox-relay config check` parses and validates a config file and the
environment it refers to, prints every error with its key and line, and exits 2, without connecting
to anything; `--print` shows the effective config with defaults filled in and secrets masked."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import time

from conftest import RELAY_BIN, free_port

# A database nobody listens on: config check must not try it.
URL = f"postgresql://relay:hunter2-db@127.0.0.1:{free_port()}/app"
SECRET = "whsec_" + base64.b64encode(b"a-signing-key-of-32-bytes-length").decode()


def check(workdir, text: str, *args, env=None):
    path = workdir / "config.yaml"
    path.write_text(text)
    started = time.monotonic()
    proc = subprocess.run([str(RELAY_BIN), "--config", str(path), "config", "check", *args], capture_output=True,
                          text=True, timeout=20, env={"PATH": os.environ["PATH"], **(env or {})})
    assert time.monotonic() - started < 5, "config check took long: did it connect?"
    return proc


VALID = f"""\
database:
  url: {URL}
relay:
  batch_size: 200
sinks:
  - name: hooks
    type: webhook
    url: https://hooks.example.com/in
    secrets: [{SECRET}]
    headers: {{Authorization: "Bearer top-secret-token"}}
  - name: audit
    type: file
    path: /tmp/audit.jsonl
routes:
  - topics: ["order.*"]
    sinks: [hooks, audit]
"""


def test_a_valid_file_passes_without_connecting(workdir):
    proc = check(workdir, VALID)
    assert proc.returncode == 0, proc.stderr
    assert "config OK" in proc.stdout and "2 sinks, 1 routes" in proc.stdout


def test_each_kind_of_error_names_its_key_and_line(workdir):
    cases = {
        "unknown key": ("relay:\n  batch_size: 200\n  backof: {initial: 1s}\n", "line 3: relay.backof: unknown key"),
        "wrong type": ("relay:\n  batch_size: lots\n", "line 2: relay.batch_size: expected a whole number"),
        "range": ("relay:\n  poll_interval: 0ms\n", "line 2: relay.poll_interval: expected a duration from 1ms"),
        "unknown sink type": ("sinks:\n  - name: a\n    type: carrier-pigeon\n",
                              "line 3: sinks[0].type: unsupported value 'carrier-pigeon'"),
        "missing env var": ("relay:\n  lease: ${LEASE_FROM_ENV}\n",
                            "line 2: relay.lease: environment variable LEASE_FROM_ENV is not set"),
    }
    for name, (fragment, expected) in cases.items():
        text = fragment + f"database: {{url: {URL}}}\n"
        if "sinks:" not in fragment:
            text += "sinks: [{name: out, type: stdout}]\n"
        proc = check(workdir, text)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (name, proc.stderr)
        assert "hunter2" not in proc.stderr


def test_every_error_of_a_file_is_printed_not_only_the_first(workdir):
    text = f"""\
database:
  url: {URL}
  channel: Not-An-Identifier
relay:
  batch_size: 0
http:
  listen: nowhere
sinks:
  - name: hooks
    type: webhook
    url: ftp://example.com/x
  - name: audit
    type: file
  - name: out
    type: stdout
    colour: red
routes:
  - topics: ["a.*"]
    sinks: [nobody]
extra: 1
"""
    proc = check(workdir, text)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("outbox-relay: config error:")]
    for expected in ("line 3: database.channel", "line 5: relay.batch_size", "line 7: http.listen",
                     "line 11: sinks[0].url", "sinks[1].path", "line 16: sinks[2].colour: unknown key",
                     "line 19: routes[0].sinks[0]: unknown sink 'nobody'", "line 20: extra: unknown key"):
        assert any(expected in line for line in lines), (expected, proc.stderr)
    assert len(lines) == 8, proc.stderr


def test_print_shows_defaults_and_masks_secrets(workdir):
    proc = check(workdir, VALID, "--print")
    assert proc.returncode == 0, proc.stderr
    effective = json.loads(proc.stdout)
    assert effective["relay"]["batch_size"] == 200
    assert effective["relay"]["lease"] == "1m" and effective["database"]["table"] == "outbox_events"
    assert effective["database"]["url"] == "*****"
    hooks = next(s for s in effective["sinks"] if s["name"] == "hooks")
    assert hooks["secrets"] == ["*****"] and hooks["headers"]["Authorization"] == "*****"
    for secret in ("hunter2-db", SECRET, "top-secret-token"):
        assert secret not in proc.stdout + proc.stderr


def test_print_shows_the_batch_size_an_exactly_once_sink_asks_for(workdir):
    """relay.batch_size left out: 2000 with an exactly-once Kafka sink, 500 without; a value in
    the file stands. The same effective value `run` uses and logs at start."""
    def printed(relay, exactly_once):
        text = (f"database: {{url: '{URL}'}}\n{relay}sinks:\n"
                f"  - {{name: k, type: kafka, brokers: 'b:9092', topic: t, exactly_once: {exactly_once}}}\n")
        proc = check(workdir, text, "--print")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["relay"]
    assert printed("", "true")["batch_size"] == 2000
    assert printed("", "false")["batch_size"] == 500
    assert printed("relay: {batch_size: 300}\n", "true")["batch_size"] == 300
    assert printed("", "true")["in_flight_bytes"] == 64 << 20


def test_print_masks_every_sinks_secrets(workdir):
    """The effective config of every sink type carrying a password in its URL or properties: none of
    them is printed (the same description `run` logs at start)."""
    text = f"""\
database:
  url: {URL}
sinks:
  - name: k
    type: kafka
    brokers: 127.0.0.1:9092
    properties: {{sasl.mechanism: PLAIN, sasl.username: relay, sasl.password: kafka-pass-1}}
  - name: n
    type: nats
    url: nats://relay:nats-pass-2@127.0.0.1:4222
  - name: r
    type: rabbitmq
    url: amqp://relay:rabbit-pass-3@127.0.0.1:5672/
    exchange: events
  - name: s
    type: redis
    url: redis://relay:redis-pass-4@127.0.0.1:6379/0
  - name: w
    type: webhook
    url: https://user:hook-pass-5@hooks.example.com/in?token=query-pass-6
"""
    proc = check(workdir, text, "--print")
    assert proc.returncode == 0, proc.stderr
    effective = json.loads(proc.stdout)
    assert [s["type"] for s in effective["sinks"]] == ["kafka", "nats", "rabbitmq", "redis", "webhook"]
    for secret in ("hunter2-db", "kafka-pass-1", "nats-pass-2", "rabbit-pass-3", "redis-pass-4", "hook-pass-5",
                   "query-pass-6"):
        assert secret not in proc.stdout + proc.stderr, secret


def test_tracing_keys_are_checked_and_their_headers_masked(workdir):
    """Issue 46, part 3: the tracing: section. Off by default; a valid one passes, its collector
    headers masked in --print; a bad value names its key and line."""
    proc = check(workdir, VALID, "--print")
    assert json.loads(proc.stdout)["tracing"]["otlp_endpoint"] == "off"
    traced = VALID + """\
tracing:
  otlp_endpoint: https://otel.example.com:4318
  headers: {Authorization: "Bearer otel-secret-token"}
  timeout: 1s
  batch_size: 100
  root_spans: true
"""
    proc = check(workdir, traced, "--print")
    assert proc.returncode == 0, proc.stderr
    tracing = json.loads(proc.stdout)["tracing"]
    assert tracing["otlp_endpoint"] == "https://otel.example.com:4318"
    assert tracing["headers"] == {"Authorization": "*****"} and tracing["batch_size"] == 100
    assert "otel-secret-token" not in proc.stdout + proc.stderr
    for fragment, expected in (
            ("tracing:\n  otlp_endpoint: udp://c:4317\n", "line 2: tracing.otlp_endpoint: expected an http://"),
            ("tracing:\n  queue_size: 10\n  batch_size: 20\n", "line 3: tracing.batch_size: must not be larger"),
            ("tracing:\n  timeout: forever\n", "line 2: tracing.timeout"),
            ("tracing:\n  sampler: always\n", "line 2: tracing.sampler: unknown key")):
        proc = check(workdir, fragment + f"database: {{url: {URL}}}\nsinks: [{{name: out, type: stdout}}]\n")
        assert proc.returncode == 2, (fragment, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (fragment, proc.stderr)
