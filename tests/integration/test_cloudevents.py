"""Issue 12, part 3: `format: cloudevents` per sink, read back with the CloudEvents Python SDK:
structured mode in JSON Lines, binary content mode on Kafka (a real broker) and over HTTP (a real
receiver). Row headers that are valid extension names become extension attributes; the others are
dropped."""
from __future__ import annotations

import json
import uuid
from datetime import datetime

from cloudevents.http import from_http, from_json
from cloudevents.kafka import KafkaMessage, from_binary

from conftest import base_config, read_jsonl, run_config, wait_until
from kafka_fixtures import kafka_broker, read_topic  # noqa: F401
from webhook_receiver import receivers, webhook_sink  # noqa: F401

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# traceparent and tracestate are extensions; X-Custom (upper case, '-') and id (a context
# attribute's name) are not valid extension names and are dropped.
HEADERS = {"traceparent": TRACEPARENT, "tracestate": "rojo=00f067aa0ba902b7", "X-Custom": "1", "id": "forged"}


def rows(topic):
    return [(topic, f"order-{i}", {"order_id": i, "note": "ünïcode \"quoted\""}, HEADERS) for i in range(3)] + \
           [(topic, "", {"order_id": 99}, {})]  # no key: no subject


def check_event(event, event_id, topic, key, payload, source, created_at):
    attrs = event.get_attributes()
    assert attrs["specversion"] == "1.0"
    assert attrs["id"] == str(event_id)
    assert attrs["source"] == source
    assert attrs["type"] == topic
    assert datetime.fromisoformat(attrs["time"].replace("Z", "+00:00")) == created_at
    if key:
        assert attrs["subject"] == key
        assert attrs["traceparent"] == TRACEPARENT
        assert attrs["tracestate"] == "rojo=00f067aa0ba902b7"
    else:
        assert "subject" not in attrs and "traceparent" not in attrs
    assert "x-custom" not in attrs and "X-Custom" not in attrs
    assert event.data == payload


def created(db, ids):
    return dict(db.query("SELECT id, created_at FROM outbox_events WHERE id = ANY(%s)", (ids,)))


def test_cloudevents_in_json_lines_structured_mode(db, relays, workdir):
    path = workdir / "events.jsonl"
    relays(base_config(db, [{"name": "audit", "type": "file", "path": str(path), "format": "cloudevents"}]))
    written = rows("order.paid")
    ids = db.insert(written)
    wait_until(lambda: len(read_jsonl(path)) == len(ids), message="the events in the file")
    at = created(db, ids)
    lines = path.read_text().splitlines()
    assert len(lines) == len(ids)
    for line, event_id, (topic, key, payload, _) in zip(lines, ids, written):
        assert json.loads(line)["datacontenttype"] == "application/json"
        check_event(from_json(line), event_id, topic, key, payload, f"outbox-relay/{db.name}/outbox_events",
                    at[event_id])


def test_cloudevents_on_kafka_binary_mode(db, relays, kafka_broker):
    row_topic = "ce-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic("outbox." + row_topic, partitions=1)
    relays(base_config(db, [{"name": "kafka", "type": "kafka", "brokers": kafka_broker.bootstrap,
                             "topic": "outbox.{topic}", "format": "cloudevents",
                             "cloudevents_source": "https://shop.example/orders"}]))
    written = rows(row_topic)
    ids = db.insert(written)
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0,
               timeout=60, message="the events acknowledged by Kafka")
    at = created(db, ids)
    messages = read_topic(kafka_broker.bootstrap, "outbox." + row_topic)
    assert len(messages) == len(ids)
    for m, event_id, (topic, key, payload, _) in zip(messages, ids, written):
        names = [n for n, _ in m.headers]
        assert "content-type" in names and all(n.startswith("ce_") or n == "content-type" for n in names)
        assert m.key == key  # the key is unchanged
        event = from_binary(KafkaMessage(dict(m.headers), m.key, m.value), data_unmarshaller=json.loads)
        check_event(event, event_id, topic, key, payload, "https://shop.example/orders", at[event_id])


def test_cloudevents_over_http_binary_mode(db, relays, receivers):
    rx = receivers()
    relays(base_config(db, [webhook_sink(rx.url, timeout="5s", format="cloudevents")]))
    written = rows("order.paid")
    ids = db.insert(written)
    wait_until(lambda: rx.acked_ids() >= set(ids), timeout=30, message="the events acknowledged")
    at = created(db, ids)
    by_id = {r.event_id: r for r in rx.snapshot()}
    for event_id, (topic, key, payload, _) in zip(ids, written):
        request = by_id[event_id]
        assert request.headers["webhook-id"] == str(event_id)  # Standard Webhooks headers stay
        assert "x-custom" not in request.headers
        event = from_http(request.headers, request.body, data_unmarshaller=json.loads)
        check_event(event, event_id, topic, key, payload, f"outbox-relay/{db.name}/outbox_events", at[event_id])


def test_a_bad_format_exits_2_naming_the_key(db, workdir):
    for sink, expected in [
        ({"name": "a", "type": "file", "path": str(workdir / "x.jsonl"), "format": "avro"},
         "sinks[0].format: unsupported value 'avro', expected one of: json, cloudevents"),
        ({"name": "a", "type": "stdout", "format": "cloudevents", "cloudevents_source": ""},
         "sinks[0].cloudevents_source: must not be empty"),
    ]:
        result = run_config(workdir, base_config(db, [sink]))
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr
