"""Issue 12, part 4: the writer's W3C trace context (`traceparent`, `tracestate`, and any other
header such as `baggage`) in a row's `headers` reaches every sink unchanged: JSON Lines, Kafka
message headers (a real broker) and webhook request headers (a real receiver), so a consumer
continues the writer's trace."""
from __future__ import annotations

import uuid

from conftest import base_config, read_jsonl, wait_until
from kafka_fixtures import kafka_broker, read_topic  # noqa: F401
from webhook_receiver import receivers, webhook_sink  # noqa: F401

# The spec's examples, a tracestate of the maximum 32 list members (512 characters) with
# multi-tenant keys and the optional whitespace around commas, an unsampled parent (flags 00),
# and W3C baggage beside them.
_MEMBERS = [f"t{i:02d}@vendor={i:02d}ab" for i in range(32)]  # tenant@system=value, 15 characters each
LONG_TRACESTATE = ",".join(_MEMBERS[:31]) + ", " + _MEMBERS[31]
TRACE_HEADERS = [
    {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
     "tracestate": LONG_TRACESTATE},
    {"traceparent": "00-a3ce929d0e0e47364bf92f3577b34da6-b9c7c989f97918e1-01",
     "tracestate": "congo=ucfJifl5GOE , rojo=00f067aa0ba902b7",
     "baggage": "userId=alice,serverNode=DF%2028,isProduction=false"},
]


def traced_rows(topic):
    return [(topic, f"order-{i}", {"order_id": i}, headers) for i, headers in enumerate(TRACE_HEADERS)]


def test_tracestate_fixture_is_at_the_spec_limits():
    assert len(LONG_TRACESTATE) == 512 and LONG_TRACESTATE.count(",") == 31


def test_trace_context_reaches_json_lines_unchanged(db, relays, workdir):
    path = workdir / "events.jsonl"
    relay = relays(base_config(db, [{"name": "audit", "type": "file", "path": str(path)}]))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert(traced_rows("order.paid"))
    wait_until(lambda: len(read_jsonl(path)) == len(ids), message="the traced events in the file")

    events = read_jsonl(path)
    assert [e["id"] for e in events] == ids
    assert [e["headers"] for e in events] == TRACE_HEADERS


def test_trace_context_reaches_kafka_headers_unchanged(db, relays, kafka_broker):
    row_topic = "order-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic("outbox." + row_topic, partitions=1)
    relay = relays(base_config(db, [{"name": "kafka", "type": "kafka", "brokers": kafka_broker.bootstrap,
                                     "topic": "outbox.{topic}"}]))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert(traced_rows(row_topic))
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0,
               timeout=60, message="the traced events acknowledged by Kafka")

    messages = read_topic(kafka_broker.bootstrap, "outbox." + row_topic)
    assert [m.outbox_id for m in messages] == ids
    for m, expected in zip(messages, TRACE_HEADERS):
        names = [n for n, _ in m.headers]
        assert names[:3] == ["outbox-id", "outbox-topic", "outbox-created-at"]
        # Exact bytes, each header once: a consumer's propagator reads them as the writer wrote them.
        row_headers = [(n, v.decode()) for n, v in m.headers[3:]]
        assert sorted(row_headers) == sorted(expected.items())


def test_trace_context_reaches_webhook_headers_unchanged(db, relays, receivers):
    rx = receivers()
    relay = relays(base_config(db, [webhook_sink(rx.url, timeout="5s")]))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert(traced_rows("order.paid"))
    wait_until(lambda: rx.acked_ids() >= set(ids), timeout=30, message="the traced events acknowledged")

    by_id = {r.event_id: r for r in rx.snapshot()}
    for event_id, expected in zip(ids, TRACE_HEADERS):
        received = by_id[event_id].headers  # names lower-cased by the receiver; HTTP names are case-insensitive
        for name, value in expected.items():
            assert received[name] == value
