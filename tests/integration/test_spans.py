"""Issue 46, part 3: the relay's own spans. One span per event per sink attempt (kind PRODUCER,
"send <destination>", OpenTelemetry's messaging attributes) in the trace of the row's
`traceparent`, the writer's span its parent, exported over OTLP/HTTP to a real OpenTelemetry
Collector (tests/ops/otelcol, built by tests/ops/build-otelcol.sh) that writes them to a file.
A collector that is away costs no event: its spans are dropped and counted."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT, base_config, free_port, http_get, metric, read_jsonl, unique, wait_until
from webhook_receiver import Reply, receivers, webhook_sink  # noqa: F401


@pytest.fixture(scope="session")
def otelcol_bin() -> str:
    proc = subprocess.run([str(ROOT / "tests/ops/build-otelcol.sh")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"building the collector failed:\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


class Collector:
    """The collector as a child process: OTLP over HTTP on 127.0.0.1:port, spans to a JSON file."""

    def __init__(self, binary: str, workdir: Path, port: int):
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.path = workdir / f"spans-{port}.jsonl"
        config = {
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
            "exporters": {"file": {"path": str(self.path), "flush_interval": "100ms"}},
            "service": {"telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                        "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}}},
        }
        config_path = workdir / f"otelcol-{port}.yaml"
        config_path.write_text(json.dumps(config))
        self.log = open(workdir / f"otelcol-{port}.log", "w")
        self.proc = subprocess.Popen([binary, "--config", str(config_path)], stdout=self.log, stderr=self.log)
        wait_until(self._listening, timeout=30, message="the collector's OTLP/HTTP port")

    def _listening(self) -> bool:
        assert self.proc.poll() is None, "the collector exited"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def spans(self) -> list[dict]:
        """Every span written so far, each with its resource's attributes under "resource"."""
        out = []
        if not self.path.exists():
            return out
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line)["resourceSpans"]:
                resource = attributes(rs["resource"])
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        out.append({**span, "resource": resource})
        return out

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def collectors(otelcol_bin, workdir):
    started = []

    def start(port=None):
        c = Collector(otelcol_bin, workdir, port or free_port())
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def attributes(obj: dict) -> dict:
    """OTLP JSON attributes as a plain dict (intValue as int)."""
    out = {}
    for a in obj.get("attributes", []):
        (kind, value), = a["value"].items()
        out[a["key"]] = int(value) if kind == "intValue" else value
    return out


def traceparent(sampled=True) -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def traced_config(db, sinks, collector_endpoint, metrics_port, **tracing):
    cfg = base_config(db, sinks)
    cfg["http"] = {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"}
    cfg["tracing"] = {"otlp_endpoint": collector_endpoint, "export_interval": "200ms", "timeout": "500ms", **tracing}
    return cfg


def metrics_of(port: int) -> str:
    status, body = http_get(port, "/metrics")
    assert status == 200
    return body


def test_every_published_event_has_its_span_in_the_rows_trace(db, relays, workdir, collectors):
    collector = collectors()
    path = workdir / "events.jsonl"
    port = free_port()
    relay = relays(traced_config(db, [{"name": "audit", "type": "file", "path": str(path)}], collector.endpoint, port,
                                 service_name="orders-relay"))
    relay.wait_log("ordering lanes rebalanced")
    topic = unique("order.paid")
    rows, expected = [], {}
    for i in range(40):
        value, trace_id, span_id = traceparent()
        rows.append((topic, f"order-{i % 7}", {"n": i}, {"traceparent": value, "tracestate": "rojo=1"}))
        expected[len(rows) - 1] = (trace_id, span_id)
    # No span: an unsampled parent, no traceparent, and invalid ones (upper case, version ff, zero ids).
    unsampled, _, _ = traceparent(sampled=False)
    for headers in ({"traceparent": unsampled}, {}, {"other": "x"},
                    {"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"},
                    {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                    {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
                    {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}):
        rows.append((topic, "untraced", {"n": len(rows)}, headers))
    ids = db.insert(rows)
    wait_until(lambda: len(read_jsonl(path)) == len(ids), message="every event in the file")
    traced_ids = {ids[i]: ids_ for i, ids_ in expected.items()}
    wait_until(lambda: len(collector.spans()) >= len(traced_ids), timeout=20, message="the spans in the collector")
    time.sleep(1.0)  # anything more would show now
    spans = collector.spans()
    by_event = Counter(attributes(s)["messaging.message.id"] for s in spans)
    assert by_event == Counter({str(i): 1 for i in traced_ids}), "exactly one span per traced, sampled event"

    created = {r[0]: r[1] for r in db.query(
        "SELECT id, extract(epoch FROM created_at) * 1e6 FROM outbox_events WHERE id = ANY(%s)", (list(traced_ids),))}
    for span in spans:
        attrs = attributes(span)
        event_id = int(attrs["messaging.message.id"])
        trace_id, parent_id = traced_ids[event_id]
        assert span["traceId"] == trace_id and span["parentSpanId"] == parent_id
        assert len(span["spanId"]) == 16 and span["spanId"] != "0" * 16 and span["spanId"] != parent_id
        assert span["kind"] == 4  # PRODUCER
        assert span["name"] == f"send {topic}"
        assert "status" not in span or span["status"].get("code", 0) == 0
        assert attrs["messaging.system"] == "file"
        assert attrs["messaging.destination.name"] == topic
        assert attrs["messaging.operation.type"] == "send" and attrs["messaging.operation.name"] == "send"
        assert attrs["outbox.sink"] == "audit" and attrs["outbox.attempt"] == 1
        start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
        assert start <= end
        # The claim delay: from the row's created_at to the claim (the span's start), in ms.
        expected_delay = (start / 1e3 - float(created[event_id])) / 1e3
        assert abs(attrs["outbox.claim_delay_ms"] - expected_delay) < 1.0
        assert 0 <= attrs["outbox.claim_delay_ms"] < 10_000
        assert span["resource"]["service.name"] == "orders-relay"
        assert span["resource"]["service.instance.id"]
    # No payload, key or other header reaches a span.
    text = collector.path.read_text()
    assert "order-" not in text and "rojo" not in text and '"n"' not in text
    body = metrics_of(port)
    assert metric(body, "outbox_relay_spans_exported_total") == len(traced_ids)
    assert metric(body, 'outbox_relay_spans_dropped_total{reason="queue_full"}') == 0
    assert metric(body, 'outbox_relay_spans_dropped_total{reason="export_failed"}') == 0
    assert relay.stop() == 0


def test_root_spans_for_rows_without_a_traceparent(db, relays, workdir, collectors):
    collector = collectors()
    path = workdir / "events.jsonl"
    relay = relays(traced_config(db, [{"name": "audit", "type": "file", "path": str(path)}], collector.endpoint,
                                 free_port(), root_spans=True))
    relay.wait_log("ordering lanes rebalanced")
    unsampled, _, _ = traceparent(sampled=False)
    ids = db.insert([("t", "k", {"n": 1}), ("t", "k", {"n": 2}, {"traceparent": "garbage"}),
                     ("t", "k", {"n": 3}, {"traceparent": unsampled})])
    wait_until(lambda: len(collector.spans()) >= 2, timeout=20, message="the root spans")
    time.sleep(1.0)
    spans = collector.spans()
    # The unsampled parent still decides: no span for it.
    assert sorted(int(attributes(s)["messaging.message.id"]) for s in spans) == ids[:2]
    for s in spans:
        assert "parentSpanId" not in s or s["parentSpanId"] == ""
        assert len(s["traceId"]) == 32 and s["traceId"] != "0" * 32
    assert spans[0]["traceId"] != spans[1]["traceId"]
    assert relay.stop() == 0


def test_a_failed_attempt_has_an_error_span_and_the_retry_its_own(db, relays, collectors, receivers):
    collector = collectors()
    lock, failed = threading.Lock(), set()

    def behaviour(req):
        with lock:
            if req.event_id not in failed:
                failed.add(req.event_id)
                return Reply(503, b"maintenance")
        return Reply(200)

    rx = receivers(behaviour)
    # Slack's and Discord's webhook URLs carry their secret in the path: no part of the URL goes
    # into a span.
    url = rx.url + "/services/T0001/B0001/secret-in-path?token=not-in-spans"
    relay = relays(traced_config(db, [webhook_sink(url, timeout="5s")], collector.endpoint, free_port()))
    relay.wait_log("ordering lanes rebalanced")
    parents = [traceparent() for _ in range(5)]
    ids = db.insert([("order.paid", f"k{i}", {"n": i}, {"traceparent": p[0]}) for i, p in enumerate(parents)])
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") == len(ids),
               timeout=30, message="every event delivered on its second attempt")
    wait_until(lambda: len(collector.spans()) >= 2 * len(ids), timeout=20, message="two spans per event")
    time.sleep(1.0)
    spans = collector.spans()
    assert len(spans) == 2 * len(ids)
    for event_id, (_, trace_id, parent_id) in zip(ids, parents):
        mine = sorted((s for s in spans if attributes(s)["messaging.message.id"] == str(event_id)),
                      key=lambda s: attributes(s)["outbox.attempt"])
        assert [attributes(s)["outbox.attempt"] for s in mine] == [1, 2]
        first, second = mine
        assert first["status"]["code"] == 2 and "503" in first["status"]["message"]
        assert "status" not in second or second["status"].get("code", 0) == 0
        for s in mine:
            assert s["traceId"] == trace_id and s["parentSpanId"] == parent_id
            assert attributes(s)["messaging.system"] == "webhook"
            assert attributes(s)["messaging.destination.name"] == "hooks"  # the sink's name
            assert s["name"] == "send hooks"
        assert int(first["endTimeUnixNano"]) <= int(second["startTimeUnixNano"])
    exported = collector.path.read_text()
    assert "not-in-spans" not in exported and "secret-in-path" not in exported and rx.url not in exported
    assert relay.stop() == 0


def test_a_collector_that_goes_away_costs_no_event(db, relays, workdir, collectors):
    collector = collectors()
    path = workdir / "events.jsonl"
    port = free_port()
    relay = relays(traced_config(db, [{"name": "audit", "type": "file", "path": str(path)}], collector.endpoint, port,
                                 queue_size=256, batch_size=64))
    relay.wait_log("ordering lanes rebalanced")
    keys = [f"key-{k}" for k in range(10)]

    def insert(n, start):
        rows = [("order.paid", keys[i % len(keys)], {"n": start + i}, {"traceparent": traceparent()[0]})
                for i in range(n)]
        ids = []
        for chunk in range(0, n, 50):
            ids += db.insert(rows[chunk:chunk + 50])
        return ids

    before = insert(200, 0)
    wait_until(lambda: len(collector.spans()) == len(before), timeout=20, message="the spans while it is up")
    collector.kill()
    after = insert(2000, 200)
    wait_until(lambda: len(read_jsonl(path)) == len(before) + len(after), timeout=60,
               message="every event delivered with the collector gone")
    wait_until(lambda: (metric(metrics_of(port), 'outbox_relay_spans_dropped_total{reason="export_failed"}') or 0)
               + (metric(metrics_of(port), 'outbox_relay_spans_dropped_total{reason="queue_full"}') or 0)
               == len(after), timeout=20, message="every span of the events after the kill counted as dropped")
    events = read_jsonl(path)
    assert Counter(e["id"] for e in events) == Counter(before + after), "each event exactly once"
    for key in keys:  # per-key order
        mine = [e["id"] for e in events if e["key"] == key]
        assert mine == sorted(mine)
    body = metrics_of(port)
    assert metric(body, "outbox_relay_spans_exported_total") == len(before)
    assert metric(body, 'outbox_relay_spans_dropped_total{reason="export_failed"}') > 0
    assert any("spans not exported" in line.get("msg", "") for line in relay.logs())
    assert relay.stop() == 0


def test_no_collector_at_all_costs_no_event_and_no_secret_is_logged(db, relays, workdir):
    path = workdir / "events.jsonl"
    port = free_port()
    token = "Bearer tok-" + secrets.token_hex(8)
    relay = relays(traced_config(db, [{"name": "audit", "type": "file", "path": str(path)}],
                                 f"http://127.0.0.1:{free_port()}", port, headers={"Authorization": token}))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([("t", f"k{i % 3}", {"n": i}, {"traceparent": traceparent()[0]}) for i in range(100)])
    wait_until(lambda: len(read_jsonl(path)) == len(ids), message="every event delivered")
    wait_until(lambda: metric(metrics_of(port), 'outbox_relay_spans_dropped_total{reason="export_failed"}') == 100,
               timeout=20, message="the spans dropped and counted")
    assert [e["id"] for e in read_jsonl(path)] == ids
    assert relay.stop() == 0
    assert token[7:] not in relay.raw_logs()
