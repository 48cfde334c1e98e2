"""The webhook sink with several events a request (`events_per_request`), against a real HTTP
receiver and a real Postgres: the body is a JSON array of the events' records, signed as a whole;
a key never has two events in one request; a refused request of several is sent again event by
event, so only the event the receiver refuses is dead-lettered; a failed request holds its keys.
"""
from __future__ import annotations

import hashlib
import json
import threading

import pytest
from standardwebhooks.webhooks import Webhook

from conftest import base_config, pending, wait_until
from webhook_receiver import Reply, new_secret, receivers, webhook_sink  # noqa: F401

PER_REQUEST = 10


def events_of(req) -> list[dict]:
    """The records a request carried, in body order."""
    body = json.loads(req.body)
    assert isinstance(body, list) and 1 <= len(body) <= PER_REQUEST, req.body[:200]
    return body


def record_id(record: dict) -> int:
    return int(record["id"])  # a number in the json format, a string in CloudEvents


def record_key(record: dict) -> str:
    return record["key"] if "key" in record else record.get("subject", "")


def accepted_in_order(rx) -> list[dict]:
    """The records of the requests the receiver answered 2xx, in the order it decided them."""
    acked = sorted((r for r in rx.snapshot() if r.ack_seq is not None), key=lambda r: r.ack_seq)
    return [record for r in acked for record in events_of(r)]


def assert_one_request_a_key_at_a_time(rx):
    """No two requests carrying one key are in flight at once: each arrives after the one before
    it was answered."""
    by_key = {}
    for r in rx.snapshot():
        for record in events_of(r):
            by_key.setdefault(record_key(record), []).append(r)
    for key, requests in by_key.items():
        requests.sort(key=lambda r: r.arrived)
        for before, after in zip(requests, requests[1:]):
            assert before.answered and after.arrived >= before.answered, f"key {key}: two requests at once"


def assert_key_order(records: list[dict]):
    last = {}
    for record in records:
        key, i = record_key(record), record_id(record)
        assert last.get(key, 0) < i, f"key {key}: {i} accepted after {last[key]}"
        last[key] = i


@pytest.mark.parametrize("fmt", ["json", "cloudevents"])
def test_several_events_a_request_signed_as_one_each_event_once_in_key_order(db, relays, receivers, fmt):
    secret = new_secret()
    rx = receivers()
    relays(base_config(db, [webhook_sink(rx.url, secrets=[secret], events_per_request=PER_REQUEST, format=fmt)]))
    # A row header the sink reserves is dropped from the body's record too.
    events = [("order.paid", f"key-{i % 30}", {"n": i, "text": "grüße \"q\""},
               {"x-trace-id": f"t-{i}", **({"webhook-id": "spoofed", "Outbox-Id": "1"} if i % 3 == 0 else {})})
              for i in range(600)]
    ids = db.insert(events)
    wait_until(lambda: pending(db) == 0, timeout=30, message="all delivered")
    assert db.query("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL AND attempts = 0")[0][0] == 600

    requests = rx.snapshot()
    by_id = {}
    for r in requests:
        h = r.headers
        records = events_of(r)
        expected_type = "application/cloudevents-batch+json" if fmt == "cloudevents" else "application/json"
        assert h["content-type"] == expected_type
        in_request = [record_id(e) for e in records]
        assert in_request == sorted(in_request), "a body's events in id order"
        digest = hashlib.sha256(",".join(map(str, in_request)).encode()).hexdigest()[:32]
        assert h["webhook-id"] == f"batch_{digest}", "the id names the events it carries"
        Webhook(secret).verify(r.body, h)  # one signature over the whole array
        keys = [record_key(e) for e in records]
        assert len(set(keys)) == len(keys), f"a key twice in one request: {keys}"
        for e in records:
            by_id.setdefault(record_id(e), []).append(e)
    assert sorted(by_id) == sorted(ids), "every event sent"
    assert all(len(v) == 1 for v in by_id.values()), "each event in one request"
    assert len(requests) <= len(ids) // 3, f"{len(requests)} requests for {len(ids)} events"

    for i, (topic, key, payload, headers) in zip(ids, events):
        record = by_id[i][0]
        if fmt == "json":
            kept = {"x-trace-id": headers["x-trace-id"]}
            assert (record["topic"], record["key"], record["payload"], record["headers"]) == (topic, key, payload, kept)
            assert record["created_at"]
        else:
            assert record["specversion"] == "1.0" and record["id"] == str(i)
            assert (record["type"], record["subject"], record["data"]) == (topic, key, payload)
    assert_key_order(accepted_in_order(rx))
    assert_one_request_a_key_at_a_time(rx)
    print(f"\n{fmt}: {len(ids)} events in {len(requests)} requests")


def test_a_refused_request_of_several_goes_again_event_by_event_only_the_poison_is_dead_lettered(db, relays,
                                                                                                receivers):
    lock, failed_once = threading.Lock(), []

    def behaviour(req):
        records = json.loads(req.body)
        if any(e["payload"].get("poison") for e in records):
            return Reply(400, b'{"error":"amount must be positive"}')
        flaky = any(e["payload"].get("flaky") for e in records)
        with lock:
            first = flaky and not failed_once
            if first:
                failed_once.append([e["id"] for e in records])
        if first:
            return Reply(503, b"busy", delay=0.2)
        return Reply(200)

    rx = receivers(behaviour)
    # Pending before the relay starts: the first batch holds every event.
    events = []
    for n in range(12):
        for k in range(20):
            events.append(("order.paid", f"key-{k}", {"n": n, "poison": (k, n) in {(3, 2), (7, 5), (7, 9)},
                                                      "flaky": (k, n) == (11, 1)}))
    ids = db.insert(events)
    poison = {i for i, e in zip(ids, events) if e[2]["poison"]}
    relays(base_config(db, [webhook_sink(rx.url, events_per_request=PER_REQUEST, max_in_flight=4)],
                       backoff={"initial": "1s", "max": "1s"}, sweep_interval="1s"))
    wait_until(lambda: pending(db) == 0, timeout=60, interval=0.1, message="nothing pending")

    state = {r[0]: r[1:] for r in db.query(
        "SELECT id, processed_at IS NOT NULL, dead_lettered_at IS NOT NULL, attempts, last_error FROM outbox_events")}
    for i in poison:
        done, dead, attempts, last_error = state[i]
        sent = [(r.seq, r.status, [record_id(e) for e in json.loads(r.body)]) for r in rx.snapshot()
                if i in [record_id(e) for e in json.loads(r.body)]]
        assert dead and not done and attempts == 1, (state[i], i, sent, failed_once)
        assert "HTTP 400" in last_error and "amount must be positive" in last_error, last_error
        alone = [r for r in rx.snapshot() if [record_id(e) for e in json.loads(r.body)] == [i]]
        assert len(alone) == 1 and alone[0].status == 400, "the poison went alone once, and was refused"
    retried = set(failed_once[0])
    assert len(retried) > 1, "the 503 answered a request of several"
    for i in set(ids) - poison:
        done, dead, attempts, _ = state[i]
        assert done and not dead, (i, state[i])
        assert attempts == (1 if i in retried else 0), (i, state[i])

    accepted = accepted_in_order(rx)
    assert sorted(record_id(e) for e in accepted) == sorted(set(ids) - poison), "every other event accepted once"
    assert_key_order(accepted)
    assert_one_request_a_key_at_a_time(rx)
    # Each refused request of several: every one of its events went again alone, after it.
    requests = rx.snapshot()
    refused = [r for r in requests if r.status == 400]
    several = [r for r in refused if len(events_of(r)) > 1]
    assert several, "no request of several was refused"
    for r in several:
        for i in (record_id(e) for e in events_of(r)):
            assert any([record_id(e) for e in events_of(a)] == [i] and a.arrived >= r.answered for a in requests), \
                f"{i} was not sent alone after its request of {len(events_of(r))} was refused"
    print(f"\n{len(rx.snapshot())} requests; {len(refused)} refused (of them {len(poison)} alone); "
          f"{len(retried)} events of the 503 request retried")
