"""Issue 4: the webhook sink against a real HTTP(S) receiver on 127.0.0.1 and a real Postgres."""
from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import random
import threading
import time
import urllib.request

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from conftest import base_config, free_port, pending, run_config, wait_until
from webhook_receiver import (Reply, make_self_signed_cert, new_secret, receivers, server_tls_context,  # noqa: F401
                              webhook_sink)


def rows(db):
    """id -> (key, done, dead, attempts, last_error)"""
    return {r[0]: r[1:] for r in db.query(
        "SELECT id, aggregate_id, processed_at IS NOT NULL, dead_lettered_at IS NOT NULL, attempts, last_error "
        "FROM outbox_events ORDER BY id")}


def assert_first_acks_in_key_order(receiver, key_of):
    """Per key, the order in which ids first got a 2xx is id order."""
    acked = sorted((r for r in receiver.snapshot() if r.ack_seq is not None), key=lambda r: r.ack_seq)
    seen, last = set(), {}
    for r in acked:
        if r.event_id in seen:
            continue
        seen.add(r.event_id)
        key = key_of[r.event_id]
        assert last.get(key, 0) < r.event_id, f"key {key}: id {r.event_id} first acked after {last[key]}"
        last[key] = r.event_id


def test_1_every_id_acked_in_key_order_despite_500s_and_stalls(db, relays, receivers):
    timeout = 0.5
    rnd, lock = random.Random(4), threading.Lock()

    def behaviour(req):
        with lock:
            x = rnd.random()
        if x < 0.04:
            return Reply(stall=timeout + 0.4)  # past the sink timeout: the relay gives up first
        if x < 0.20:
            return Reply(500, b'{"error":"try later"}')
        return Reply(200)

    rx = receivers(behaviour)
    # A short sweep bounds what a missed retry wake-up of the core loop costs (see test 4).
    relay = relays(base_config(db, [webhook_sink(rx.url, timeout="500ms", max_in_flight=32)], max_attempts=50,
                               sweep_interval="1s"))
    ids = []
    for chunk in range(10):  # written while the relay runs: NOTIFY drives the claims
        ids += db.insert([("order.paid", f"key-{random.Random(chunk * 1000 + i).randrange(100)}", {"chunk": chunk, "i": i})
                          for i in range(1000)])
    assert len(ids) == 10_000

    def check():
        # Snapshot the database first: the acked set only grows, so any done id must be in it.
        done = {r[0] for r in db.query("SELECT id FROM outbox_events WHERE processed_at IS NOT NULL")}
        missing = done - rx.acked_ids()
        assert not missing, f"marked done without a 2xx: {sorted(missing)[:10]}"
        return pending(db) == 0

    wait_until(check, timeout=240, interval=0.5, message="all 10,000 events delivered")
    state = rows(db)
    assert all(done and not dead for (_, done, dead, _, _) in state.values()), "every row done, none dead-lettered"
    assert set(state) == set(ids)
    assert set(ids) <= rx.acked_ids(), "every id received with a 2xx at least once"
    assert_first_acks_in_key_order(rx, {i: v[0] for i, v in state.items()})

    requests = rx.snapshot()
    stalls = sum(1 for r in requests if r.status is None)
    errors = sum(1 for r in requests if r.status == 500)
    assert errors > 1000 and stalls > 200, (errors, stalls)  # the faults really happened
    assert any(attempts > 0 for (_, _, _, attempts, _) in state.values())
    # Keep-alive: a connection is only replaced after a timeout made curl drop it.
    assert rx.connections <= stalls + 2 * 32, (rx.connections, stalls)
    assert relay.alive()
    print(f"\nrequests={len(requests)} 500s={errors} stalls={stalls} connections={rx.connections}")


def test_2_signatures_verify_independently_with_two_secrets(db, relays, receivers):
    secret_a, secret_b = new_secret(), new_secret()
    rx = receivers()
    sink = webhook_sink(rx.url, secrets=[secret_a, "${WEBHOOK_SECRET_B}"],
                        headers={"Authorization": "Bearer static-token-1234", "X-Static": "yes"})
    config = base_config(db, [sink])
    port = free_port()
    config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
    relay = relays(config, env={"WEBHOOK_SECRET_B": secret_b})
    payloads = [{"n": i, "text": "grüße ✓ \"quoted\"", "nested": {"list": [1, 2.5, None, True]}} for i in range(40)]
    payloads.append({"big": "x" * 5000})  # > 1 KiB: no Expect: 100-continue round trip
    # Headers the sink reserves (issue 43): webhook-*, outbox-*, ce-*, in any case, and those its
    # config sets. Dropped and counted; the others travel.
    spoofed = {"webhook-id": "spoofed", "Outbox-Id": "999999", "ce-id": "forged", "x-static": "from-the-row"}
    ids = db.insert([("order.paid", f"k{i % 7}", p, {"x-trace-id": f"trace-{i}", **spoofed})
                     for i, p in enumerate(payloads)])
    wait_until(lambda: pending(db) == 0, timeout=30, message="all delivered")

    db_text = dict(db.query("SELECT id, payload::text FROM outbox_events"))
    key_a = base64.b64decode(secret_a[len("whsec_"):])
    key_b = base64.b64decode(secret_b[len("whsec_"):])
    requests = rx.snapshot()
    assert {r.event_id for r in requests} == set(ids)
    for r in requests:
        h = r.headers
        assert h["webhook-id"] == str(r.event_id)  # the event id, not the row's spoofed header
        assert h["content-type"] == "application/json"
        assert abs(int(h["webhook-timestamp"]) - r.wall) <= 5
        assert r.body == db_text[r.event_id].encode(), "body is the payload's JSON text, byte for byte"
        assert json.loads(r.body) == payloads[ids.index(r.event_id)]
        assert h["x-trace-id"] == f"trace-{ids.index(r.event_id)}"
        assert h["authorization"] == "Bearer static-token-1234" and h["x-static"] == "yes"
        assert "outbox-id" not in h and "ce-id" not in h
        # The standardwebhooks reference package accepts it under each secret alone ...
        Webhook(secret_a).verify(r.body, h)
        Webhook(secret_b).verify(r.body, h)
        with pytest.raises(WebhookVerificationError):
            Webhook(new_secret()).verify(r.body, h)
        # ... and plain hmac agrees: one v1 signature per secret, in config order.
        signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + r.body
        expected = [f"v1,{base64.b64encode(hmac.new(k, signed, hashlib.sha256).digest()).decode()}" for k in (key_a, key_b)]
        assert h["webhook-signature"].split(" ") == expected

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    assert f'outbox_relay_headers_dropped_total{{sink="hooks"}} {4 * len(ids)}' in exposition
    logs = relay.raw_logs()
    for secret in (secret_a, secret_b, "static-token-1234"):
        assert secret not in logs
    assert "*****" in logs


def test_3_poison_400_is_dead_lettered_after_one_attempt_other_keys_flow(db, relays, receivers):
    def behaviour(req):
        if json.loads(req.body).get("poison"):
            return Reply(400, b'{"error":"amount must be positive","field":"amount"}\n')
        return Reply(200)

    rx = receivers(behaviour)
    relays(base_config(db, [webhook_sink(rx.url)]))
    events = []
    for k in range(20):
        for n in range(10):
            poison = (k, n) in {(0, 0), (1, 4), (2, 9), (3, 3), (3, 6)}
            events.append(("order.paid", f"key-{k}", {"n": n, "poison": poison}))
    ids = db.insert(events)
    poison_ids = {i for i, e in zip(ids, events) if e[2]["poison"]}
    wait_until(lambda: pending(db) == 0, timeout=30, message="nothing pending")

    state = rows(db)
    for i in poison_ids:
        key, done, dead, attempts, last_error = state[i]
        assert dead and not done and attempts == 1, state[i]
        assert "HTTP 400" in last_error and '{"error":"amount must be positive","field":"amount"}' in last_error
        assert len(rx.requests_for(i)) == 1, "dead-lettered after one attempt"
    for i in set(ids) - poison_ids:
        key, done, dead, attempts, _ = state[i]
        assert done and not dead and attempts == 0, (i, state[i])
        assert len(rx.requests_for(i)) == 1
    assert_first_acks_in_key_order(rx, {i: v[0] for i, v in state.items()})
    assert rx.connections <= 16, "connections are kept alive and reused (max_in_flight 16)"


def test_4_429_retry_after_is_respected(db, relays, receivers):
    first_seen, lock = {}, threading.Lock()
    retry_date = {}

    def behaviour(req):
        role = json.loads(req.body)["role"]
        with lock:
            first = role not in first_seen
            first_seen.setdefault(role, req)
        if role == "seconds" and first:
            return Reply(429, b"slow down", {"Retry-After": "2"})
        if role == "date" and first:
            when = int(time.time()) + 3
            retry_date["at"] = when
            return Reply(503, b"maintenance", {"Retry-After": email.utils.formatdate(when, usegmt=True)})
        return Reply(200)

    rx = receivers(behaviour)
    # A long backoff cap, so the cap does not hide the Retry-After; a short initial backoff, so
    # only the Retry-After can explain a 2 s wait.
    # The sweep only bounds a missed retry wake-up: the core loop computes a retry's due time
    # before the database stores next_attempt_at, so its wake-up can come a moment early, find
    # nothing due and wait for the sweep. A sweep never claims a row before next_attempt_at.
    relays(base_config(db, [webhook_sink(rx.url)], backoff={"initial": "100ms", "max": "10s"}, sweep_interval="1s"))
    t0 = time.monotonic()
    a, a_next, b, c = db.insert([("t", "key-a", {"role": "seconds"}), ("t", "key-a", {"role": "after-a"}),
                                 ("t", "key-b", {"role": "date"}), ("t", "key-c", {"role": "plain"})])
    wait_until(lambda: pending(db) == 0, timeout=30, message="all delivered")

    first_a, second_a = rx.requests_for(a)[:2]
    assert first_a.status == 429 and second_a.status == 200
    assert second_a.arrived - first_a.answered >= 2.0, second_a.arrived - first_a.answered
    assert len(rx.requests_for(a)) == 2
    # The later event of key-a waited behind it.
    (after_a,) = rx.requests_for(a_next)
    assert after_a.arrived >= second_a.answered

    first_b, second_b = rx.requests_for(b)[:2]
    assert first_b.status == 503 and second_b.status == 200
    assert second_b.wall >= retry_date["at"], (second_b.wall, retry_date["at"])

    (plain,) = rx.requests_for(c)
    assert plain.arrived - t0 < 1.5, "other keys do not wait"
    assert "HTTP 429" in rows(db)[a][4]


def test_5_slow_receiver_never_holds_a_transaction_open(db, relays, receivers):
    rx = receivers(lambda req: Reply(200, delay=2.0))
    # The sink starts no request later than `timeout` into a batch and releases the rest; the
    # runner picks released rows up at the next wakeup, so a short sweep keeps this test short.
    relays(base_config(db, [webhook_sink(rx.url, timeout="5s", max_in_flight=4)], sweep_interval="1s"))
    ids = db.insert([("t", f"k{i % 8}", {"i": i}) for i in range(16)])

    worst = 0.0
    busy_polls = 0
    with db.connect() as conn:
        deadline = time.monotonic() + 60
        while pending(db) > 0 and time.monotonic() < deadline:
            for state, age in conn.execute(
                    "SELECT state, extract(epoch FROM now() - state_change) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "  AND state LIKE 'idle in transaction%'").fetchall():
                worst = max(worst, float(age))
            busy_polls += rx.in_flight() > 0
            time.sleep(0.1)
    assert pending(db) == 0
    assert busy_polls >= 30, "the receiver was busy while we watched"
    assert worst <= 1.0, f"a session was idle in transaction for {worst:.2f}s"
    assert rx.acked_ids() == set(ids)


def test_6_tls_self_signed_refused_without_ca_file_accepted_with_it(db, relays, receivers, workdir):
    cert, key = make_self_signed_cert(workdir)
    rx = receivers(ssl_context=server_tls_context(cert, key))
    (event_id,) = db.insert([("t", "k", {"secure": True})])

    untrusting = relays(base_config(db, [webhook_sink(rx.url, timeout="2s")]))
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (event_id,)) >= 1,
               timeout=20, message="a failed attempt")
    _, done, dead, attempts, last_error = rows(db)[event_id]
    assert not done and not dead
    assert last_error.startswith("hooks: TLS error:"), last_error
    assert rx.snapshot() == [] and rx.tls_failures >= 1
    assert untrusting.stop() == 0

    trusting = relays(base_config(db, [webhook_sink(rx.url, timeout="2s", tls={"ca_file": str(cert)})]))
    wait_until(lambda: pending(db) == 0, timeout=20, message="delivered over verified TLS")
    assert rx.acked_ids() == {event_id}
    assert trusting.alive()


def test_7_a_retry_left_by_a_stopped_instance_goes_out_when_due_not_at_the_sweep(db, relays, receivers):
    """Relay A's attempt fails and it schedules the retry 10 s later (Retry-After); relay B,
    started beside it, owns half of the lanes; A stops and B gains the rest. Polls look only
    above what claims covered, so B must find the retry itself: it goes out about when due, long
    before B's sweep (60 s), in its key's order."""
    first = threading.Event()

    def behaviour(req):
        if not first.is_set():
            first.set()
            return Reply(503, b"maintenance", {"Retry-After": "10"})
        return Reply(200)

    rx = receivers(behaviour)
    cfg = base_config(db, [webhook_sink(rx.url, timeout="2s")], sweep_interval="60s",
                      backoff={"initial": "100ms", "max": "30s"})  # a cap above the Retry-After
    a = relays(cfg, name="a")
    retried, later = db.insert([("t", "k", {"n": 1}), ("t", "k", {"n": 2})])
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (retried,)) == 1,
               timeout=20, message="the failed attempt")
    b = relays(cfg, name="b")
    b.wait_log("ordering lanes rebalanced")
    assert a.stop() == 0
    due = db.scalar("SELECT extract(epoch FROM next_attempt_at - now()) FROM outbox_events WHERE id = %s",
                    (retried,))
    t_due = time.monotonic() + float(due)
    assert float(due) > 2.0, "the retry was due before A stopped: this test would not tell"
    wait_until(lambda: pending(db) == 0, timeout=20, message="both delivered by B")
    first_ok = next(r for r in rx.requests_for(retried) if r.status == 200)
    assert first_ok.arrived - t_due < 2.0, f"the retry went out {first_ok.arrived - t_due:.1f} s after it was due"
    (after,) = rx.requests_for(later)
    assert after.arrived >= first_ok.answered
    assert [r.status for r in rx.requests_for(retried)] == [503, 200]
    assert b.alive()


def test_8_a_later_event_committed_as_its_keys_retry_falls_due_waits_for_it(db, relays, receivers):
    """A failed event R holds the later events of its key until its retry succeeds. When the retry
    falls due the runner claims R again some tens of milliseconds later; a poll in between looks
    only above what earlier claims covered (R is below) and must not take a later event of R's key
    (schema 7; before it, such an event was acked before R). One key gets an event every 10 ms and
    every 8th first attempt fails with a retry 300 ms later, so retries fall due again and again
    while the key's events flow."""
    lock, failed = threading.Lock(), set()

    def behaviour(req):
        with lock:
            if req.event_id % 8 == 0 and req.event_id not in failed:
                failed.add(req.event_id)
                return Reply(503, b"busy")  # retried after the backoff, 300 ms
        return Reply(200)

    rx = receivers(behaviour)
    relay = relays(base_config(db, [webhook_sink(rx.url, timeout="2s")], sweep_interval="60s",
                               backoff={"initial": "300ms", "max": "300ms"}))
    ids = []
    for i in range(400):  # one commit each, 100/s
        ids += db.insert([("t", "k", {"i": i})])
        time.sleep(0.01)
    wait_until(lambda: pending(db) == 0, timeout=60, message="every event delivered")
    assert len(failed) >= 40, f"only {len(failed)} retries: this test would not tell"
    assert set(ids) == rx.acked_ids()
    assert_first_acks_in_key_order(rx, {i: "k" for i in ids})
    assert relay.alive()


BAD_WEBHOOK_CONFIGS = [
    ({"type": "webhook"}, "sinks[0].url: required, but missing"),
    ({"type": "webhook", "url": "ftp://x/"}, "sinks[0].url: unsupported scheme 'ftp'"),
    ({"type": "webhook", "url": "http://x/", "secrets": ["hunter2hunter2"]},
     "sinks[0].secrets[0]: expected a Standard Webhooks secret, whsec_ followed by the base64 key"),
    ({"type": "webhook", "url": "http://x/", "secrets": ["whsec_hunter2!!"]}, "is not valid base64"),
    ({"type": "webhook", "url": "http://x/", "max_in_flight": 0}, "sinks[0].max_in_flight: expected a whole number from 1 to 256"),
    ({"type": "webhook", "url": "http://x/", "tls": {"ca_file": "/nonexistent/ca.pem"}},
     "sinks[0].tls.ca_file: cannot read /nonexistent/ca.pem"),
]


@pytest.mark.parametrize("sink,expected", BAD_WEBHOOK_CONFIGS)
def test_bad_webhook_config_exits_2_naming_the_key(workdir, sink, expected):
    config = {"database": {"url": "postgresql://relay@127.0.0.1:1/app"}, "sinks": [{"name": "hooks", **sink}]}
    proc = run_config(workdir, config)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout


def test_a_lease_shorter_than_a_batch_in_the_sinks_sends_nothing_twice(db, relays, receivers):
    """Issue 10, defect 3: with `lease: 1s` and a receiver that answers after 1.5 s, every batch
    outlives its lease while it is in the sinks. The relay never claims a row it leased itself,
    so the batch claimed ahead is not claimed again: each event is sent exactly once, in key order."""
    rx = receivers(lambda req: Reply(200, delay=1.5))
    keys = [f"key-{i % 6}" for i in range(24)]
    ids = db.insert([("order.paid", key, {"i": i}) for i, key in enumerate(keys)])
    key_of = dict(zip(ids, keys))
    # Full batches of 6 (one event per key, sent concurrently): each spends ~1.5 s in the sink,
    # and the next one is claimed ahead while it does (no rebalance pause in between, which would
    # write the outcomes before the next claim).
    relays(base_config(db, [webhook_sink(rx.url, timeout="5s", max_in_flight=8)], batch_size=6, lease="1s",
                       rebalance_interval="60s"))
    wait_until(lambda: pending(db) == 0, timeout=60, interval=0.2, message="all 24 events delivered")
    sent = sorted(r.event_id for r in rx.snapshot())
    assert sent == sorted(ids), f"sent twice: {sorted({i for i in sent if sent.count(i) > 1})}"
    assert_first_acks_in_key_order(rx, key_of)
    assert all(done and not dead for _, done, dead, _, _ in rows(db).values())
