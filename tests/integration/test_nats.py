"""Issue 13: the nats (JetStream) sink with the real relay binary, a real Postgres and a real
nats-server (Debian's package) started by the test run on a free 127.0.0.1 port; the stream is
read back with the ecosystem's own client, nats-py (nats_fixtures.py)."""
from __future__ import annotations

import datetime
import json
import time
import uuid

from nats.js.api import DiscardPolicy

from conftest import (Writers, assert_no_dead_letters, base_config, check_failed_events_hold_their_keys,
                      check_held_keys_caught_up, pending, rows_by_id, run_cli, unique, wait_until)
from nats_fixtures import check_order, nats_server, nats_server_with_password, own_nats_server, read_stream  # noqa: F401


def nats_sink(url, subject="outbox.{topic}", **extra):
    sink = {"name": "nats", "type": "nats", "url": url, "subject": subject}
    sink.update(extra)
    return [sink]


def stream_for(server, row_topic):
    """A stream capturing outbox.<row_topic>; its name."""
    name = "S" + uuid.uuid4().hex[:10].upper()
    server.add_stream(name, [f"outbox.{row_topic}"])
    return name


def done(db):
    return db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")


def test_1_twenty_thousand_events_reach_the_stream_once_in_key_order(db, relays, nats_server):
    row_topic = unique("order")
    stream = stream_for(nats_server, row_topic)
    relay = relays(base_config(db, nats_sink(nats_server.url)))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=4990, keys=200, topic=row_topic).start()
    # Row headers travel as NATS headers; a Nats-* header (it would steer JetStream: here it would
    # make every publish fail) is dropped with a warning.
    with_headers = db.insert([(row_topic, f"key-{i}", {"special": i},
                               {"trace-id": f"t-{i}", "tenant": "acme", "Nats-Expected-Stream": "NOPE",
                                "outbox-id": "999999", "OUTBOX-TOPIC": "spoofed", "ce-id": "forged"})
                              for i in range(40)])
    writers.join()
    started = time.monotonic()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows")
    drained_after = time.monotonic() - started
    assert_no_dead_letters(db)
    assert db.scalar("SELECT count(*) FROM outbox_events") == 20_000

    messages = read_stream(nats_server, stream)
    assert len(messages) == 20_000, "exactly one message per event"
    result = check_order(messages)
    assert result["duplicates"] == 0
    rows = rows_by_id(db)
    assert result["ids"] == set(rows)
    for m in messages:
        topic, key, payload, _, created_at, *_ = rows[m.outbox_id]
        assert m.subject == "outbox." + topic
        assert m.data.decode() == payload  # the payload's JSON text as Postgres renders it
        assert m.headers["Nats-Msg-Id"] == str(m.outbox_id)
        assert m.headers["outbox-topic"] == topic
        assert m.key == key
        sent = datetime.datetime.fromisoformat(m.headers["outbox-created-at"].replace("Z", "+00:00"))
        assert sent == created_at
    by_id = {m.outbox_id: m for m in messages}
    for i, oid in enumerate(with_headers):
        h = by_id[oid].headers
        assert h["trace-id"] == f"t-{i}" and h["tenant"] == "acme"
        assert h["outbox-id"] == str(oid) and h["outbox-topic"] == row_topic
        assert {k for k in h if not k.lower().startswith("outbox-")} == {"Nats-Msg-Id", "trace-id", "tenant"}
    assert any(l.get("msg", "").startswith("a row header carries a name the sink reserves") for l in relay.logs())
    assert relay.alive()
    print(f"\n20,000 events drained {drained_after:.1f}s after the writers finished")


def test_2_server_killed_and_restarted_mid_drain_nothing_lost_no_duplicate(db, relays, own_nats_server):
    server = own_nats_server
    row_topic = unique("payment")
    stream = stream_for(server, row_topic)
    relay = relays(base_config(db, nats_sink(server.url, timeout="1s"), backoff={"initial": "200ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=5000, keys=100, topic=row_topic, pause=0.02).start()
    wait_until(lambda: done(db) >= 3000, timeout=60, message="3,000 events delivered before the kill")
    server.kill()  # SIGKILL mid-drain: publishes in flight lose their server
    killed_at = time.monotonic()
    done_at_kill = done(db)
    time.sleep(2)  # the outage the relay must ride out (not a correctness wait)
    # While the server is gone, at most the batches already acknowledged complete.
    assert done(db) - done_at_kill <= 1000, "rows marked done while no server could acknowledge them"
    assert pending(db) > 0
    server.start()  # same port, same store
    down_for = time.monotonic() - killed_at
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows after the restart")

    rows = rows_by_id(db)
    assert len(rows) == 20_000
    assert_no_dead_letters(db)
    retried = db.scalar("SELECT count(*) FROM outbox_events WHERE attempts > 0")
    assert retried > 0, "the outage should have made some events retry"

    messages = read_stream(server, stream)
    result = check_order(messages)
    # Every row the relay marked done is in the stream (nothing marked without a PubAck), and the
    # re-sends of events the server had stored before the kill were dropped by JetStream's
    # de-duplication (Nats-Msg-Id within the stream's 2-minute window): no duplicate.
    assert result["ids"] == set(rows)
    assert result["duplicates"] == 0
    assert len(messages) == 20_000
    reported = sum(l.get("duplicates", 0) for l in relay.logs()
                   if l.get("msg", "").startswith("nats: JetStream reported re-sent events as duplicates"))
    assert relay.alive()
    print(f"\nserver down {down_for:.1f}s; {retried} rows retried; {len(messages)} messages for 20,000 rows; "
          f"re-sends JetStream reported as duplicates (not stored again): {reported}")


def test_3_permanent_errors_are_dead_lettered_at_once_and_the_rest_flow(db, relays, nats_server):
    row_topic = unique("big")
    stream = "S" + uuid.uuid4().hex[:10].upper()
    nats_server.add_stream(stream, [f"outbox.{row_topic}"], max_msg_size=4096)
    relay = relays(base_config(db, nats_sink(nats_server.url, no_stream="permanent"), max_attempts=5))
    relay.wait_log("ordering lanes rebalanced")
    big = {"blob": "x" * 8000}
    ids = db.insert([(row_topic, "k1", {"n": 1}), (row_topic, "k1", big), (row_topic, "k1", {"n": 3}),
                     ("no stream " + row_topic, "k2", {"n": 4}),  # a subject with spaces: never valid
                     ("orphan-" + row_topic, "k2", {"n": 5}),     # no stream captures outbox.orphan-...
                     (row_topic, "k2", {"n": 6}), (row_topic, "k3", {"n": 7})])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    rows = rows_by_id(db)
    # rows: topic, aggregate_id, payload, headers, created_at, processed_at, attempts, dead_lettered_at, last_error
    for oid, reason in ((ids[1], "nats: JetStream error 10054: message size exceeds maximum allowed"),
                        (ids[3], "nats: invalid NATS subject 'outbox.no stream "),
                        (ids[4], "nats: No responders available for request")):
        dead = rows[oid]
        assert dead[7] is not None and dead[5] is None, f"event {oid} is dead-lettered, not delivered"
        assert dead[6] == 1, "dead-lettered at the first attempt"
        assert dead[8].startswith(reason), dead[8]
    for oid in (ids[0], ids[2], ids[5], ids[6]):
        assert rows[oid][5] is not None, f"event {oid} was delivered"
        assert rows[oid][6] == 0
    messages = read_stream(nats_server, stream)
    assert sorted(m.outbox_id for m in messages) == [ids[0], ids[2], ids[5], ids[6]]
    check_order(messages)  # across keys the stream has no order; per key it must be id order
    failed = run_cli("failed", "list", "--json", env={"DATABASE_URL": db.url})
    assert "10054" in failed.stdout


def test_4_no_stream_retries_by_default_until_the_stream_exists(db, relays, nats_server):
    row_topic = unique("later")
    relay = relays(base_config(db, nats_sink(nats_server.url)))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([(row_topic, "k", {"n": i}) for i in range(3)])
    wait_until(lambda: db.scalar("SELECT min(attempts) FROM outbox_events WHERE id = ANY(%s)", (ids[:1],)) >= 2,
               timeout=30, message="the first event retried twice")
    first = rows_by_id(db)[ids[0]]
    assert first[5] is None and first[7] is None, "neither delivered nor dead-lettered"
    assert first[8].startswith("nats: No responders available for request"), first[8]
    assert rows_by_id(db)[ids[1]][6] == 0, "the key's later events wait unsent behind it"
    stream = stream_for(nats_server, row_topic)
    wait_until(lambda: pending(db) == 0, timeout=30, message="delivered once the stream exists")
    assert [m.outbox_id for m in read_stream(nats_server, stream)] == ids


def test_5_a_resent_event_is_dropped_by_jetstream_deduplication(db, relays, nats_server):
    # `replay` makes delivered events pending again: the relay sends them a second time with the
    # same Nats-Msg-Id, JetStream answers "duplicate" (inside its 2-minute window) and stores
    # nothing; the events count as delivered and the relay reports the duplicates.
    row_topic = unique("again")
    stream = stream_for(nats_server, row_topic)
    relay = relays(base_config(db, nats_sink(nats_server.url)))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([(row_topic, f"k{i % 2}", {"n": i}) for i in range(6)])
    wait_until(lambda: pending(db) == 0, timeout=30, message="delivered")
    run_cli("replay", "--from-id", str(ids[0]), env={"DATABASE_URL": db.url})
    wait_until(lambda: pending(db) == 0 and db.scalar(
        "SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") == 6, timeout=30,
        message="delivered again")
    reported = lambda: sum(l.get("duplicates", 0) for l in relay.logs()  # noqa: E731
                           if l.get("msg", "").startswith("nats: JetStream reported re-sent events as duplicates"))
    wait_until(lambda: reported() == 6, timeout=10, message="6 duplicates reported")
    messages = read_stream(nats_server, stream)
    assert sorted(m.outbox_id for m in messages) == ids, "each event stored once"
    check_order(messages)


def test_6_a_refused_event_holds_its_key_while_later_batches_are_pipelined_and_other_keys_flow(db, relays,
                                                                                               nats_server):
    """Issue 45: batches are pipelined into JetStream (the next enters the sink while the previous
    one's PubAcks are outstanding). An event the stream refuses (its subject is full, discard new:
    a PubAck with JetStream error 10077, retried) while later events of its key and of other keys
    are in flight: the key's later events never reach the stream before it, whether they are in
    later batches or in its own (a second key has its refused event and a later one in one batch);
    the other keys are not held. One stream, so its order is the order a consumer reads."""
    tag = unique("pipe")
    stream = "S" + uuid.uuid4().hex[:10].upper()
    # Every subject holds one message and refuses a second one (discard new, per subject). Each
    # event has a subject of its own, but the two refused ones, whose subjects the test fills first.
    nats_server.add_stream(stream, [f"{tag}.>"], max_msgs_per_subject=1, discard=DiscardPolicy.NEW,
                           discard_new_per_subject=True)
    for full in ("blocked", "blocked2"):
        nats_server.publish(f"{tag}.{full}", b"{}")
    relay = relays(base_config(db, nats_sink(nats_server.url, subject=f"{tag}.{{topic}}"), max_attempts=50,
                               backoff={"initial": "300ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")
    key, key2 = unique("held"), unique("same-batch")
    # 3,000 events in one transaction: full batches of 500, one after the other in the pipeline.
    # The held key's events are more than a batch apart, so each of them is in a batch of its own.
    held_at = {100: (None, key), 600: ("blocked", key), 1150: (None, key), 1700: (None, key), 2600: (None, key),
               2000: ("blocked2", key2), 2001: (None, key2), 2300: (None, key2)}
    rows = []
    for i in range(3000):
        topic, k = held_at.get(i, (None, f"other-{i % 50}"))
        rows.append((topic or f"e{i}", k, {"n": i}))
    ids = db.insert(rows)
    held_ids = [ids[i] for i in sorted(held_at) if held_at[i][1] == key]
    held2_ids = [ids[i] for i in sorted(held_at) if held_at[i][1] == key2]
    other_ids = [oid for i, oid in enumerate(ids) if i not in held_at]

    check_failed_events_hold_their_keys(db, held_ids, held2_ids, other_ids, "refused", "10077")

    for full in ("blocked", "blocked2"):
        nats_server.purge_stream(stream, subject=f"{tag}.{full}")  # the retries now go in, then the held events
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    messages = read_stream(nats_server, stream)
    # per key in id order, in the stream's order
    check_held_keys_caught_up(db, messages, check_order(messages), ids, {key: held_ids, key2: held2_ids})
    assert relay.alive()


def test_bad_nats_config_exits_2_naming_the_key(db, workdir):
    secret = "pw-" + uuid.uuid4().hex
    cases = (({"name": "n", "type": "nats", "subject": "x"}, "sinks[0].url: required"),
             (nats_sink("http://127.0.0.1:4222")[0], "sinks[0].url: unsupported scheme 'http'"),
             (nats_sink(f"nats://relay:{secret}@127.0.0.1:4222/x y")[0], "sinks[0].url: expected nats://"),
             (nats_sink("nats://127.0.0.1:4222", subject="events.*")[0], "sinks[0].subject:"),
             (nats_sink("nats://127.0.0.1:4222", timeout="1ms")[0], "sinks[0].timeout: expected"),
             (nats_sink("nats://127.0.0.1:4222", max_in_flight=0)[0], "sinks[0].max_in_flight:"),
             (nats_sink("nats://127.0.0.1:4222", no_stream="drop")[0], "sinks[0].no_stream: unsupported value"),
             (nats_sink("nats://127.0.0.1:4222", stream="X")[0], "sinks[0].stream: unknown key"))
    for sink, key in cases:
        config = workdir / f"bad-{uuid.uuid4().hex[:6]}.yaml"
        config.write_text(json.dumps(base_config(db, [sink])))
        proc = run_cli("run", "--config", str(config), check=False, timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert key in proc.stderr, proc.stderr
        assert secret not in proc.stderr + proc.stdout


def test_nats_password_never_reaches_the_logs(db, relays):
    secret = "nats-" + uuid.uuid4().hex
    with nats_server_with_password("relay", secret) as server:
        row_topic = unique("secret")
        stream = stream_for(server, row_topic)
        config = base_config(db, nats_sink(f"nats://relay:${{NATS_PASSWORD}}@127.0.0.1:{server.port}",
                                           timeout="1s"))
        config["log"] = {"level": "debug"}
        relay = relays(config, env={"NATS_PASSWORD": secret})
        relay.wait_log("nats connection created")
        db.insert([(row_topic, "k", {"n": 1})])
        wait_until(lambda: pending(db) == 0, timeout=30, message="delivered")
        server.kill()  # the reconnect warnings name the server too
        relay.wait_log("nats: disconnected")
        server.start()
        relay.wait_log("nats: reconnected")
        db.insert([(row_topic, "k", {"n": 2})])
        wait_until(lambda: pending(db) == 0, timeout=30, message="delivered after the reconnect")
        assert relay.stop() == 0
        assert len(read_stream(server, stream)) == 2
    logs = relay.raw_logs()
    assert secret not in logs
    started = next(l for l in relay.logs() if l.get("msg") == "starting outbox-relay")
    assert started["config"]["sinks"][0]["url"] == f"nats://relay:*****@127.0.0.1:{server.port}"
    assert f"nats://relay:*****@127.0.0.1:{server.port}" in logs
