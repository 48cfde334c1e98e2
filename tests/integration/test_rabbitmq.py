"""Issue 13: the RabbitMQ sink with the real relay binary, a real Postgres and a real RabbitMQ node
(Debian's rabbitmq-server, started by the test run on a free 127.0.0.1 port, see
rabbitmq_fixtures.py). Messages are read back with pika, RabbitMQ's Python client."""
from __future__ import annotations

import datetime
import json
import time
import uuid

import pika

from conftest import (Writers, assert_no_dead_letters, base_config, check_failed_events_hold_their_keys,
                      check_held_keys_caught_up, pending, rows_by_id, run_cli, run_config, unique, wait_until)
from rabbitmq_fixtures import check_order, rabbitmq, read_queue  # noqa: F401


def rabbitmq_sink(url, exchange, **extra):
    sink = {"name": "rabbitmq", "type": "rabbitmq", "url": url, "exchange": exchange}
    sink.update(extra)
    return [sink]


def test_20000_events_reach_the_queue_once_in_key_order_with_their_properties(db, relays, rabbitmq):
    exchange, queue = unique("outbox"), unique("orders")
    rabbitmq.declare(exchange, queue, "order.#")
    row_topic = "order." + uuid.uuid4().hex[:8]
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange)))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=5000, keys=200, topic=row_topic).start()
    # Headers the sink reserves (issue 43), dropped: outbox-* in any case, CC and BCC (RabbitMQ
    # would also route the message by them), x-* (RabbitMQ and its plugins act on them).
    spoofed = {"outbox-id": "999999", "Outbox-Topic": "spoofed", "CC": "other", "bcc": "other", "x-delay": "5000"}
    with_headers = db.insert([(row_topic, f"key-{i}", {"special": i},
                               {"trace-id": f"t-{i}", "tenant": "acme", **spoofed}) for i in range(10)])
    writers.join()
    started = time.monotonic()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows")
    drained_after = time.monotonic() - started
    assert_no_dead_letters(db)
    assert db.scalar("SELECT count(*) FROM outbox_events") == 20_010

    messages = read_queue(rabbitmq, queue)
    assert len(messages) == 20_010, "exactly one message per event"
    result = check_order(messages)
    assert result["duplicates"] == 0
    rows = rows_by_id(db)
    assert result["ids"] == set(rows)

    for m in messages:
        topic, key, payload, _, created_at, *_ = rows[m.outbox_id]
        assert m.routing_key == topic  # routing_key template "{topic}" (the default)
        assert m.key == key
        assert m.body.decode() == payload  # the payload's JSON text as Postgres renders it
        assert m.delivery_mode == 2 and m.content_type == "application/json"
        assert m.headers["outbox-id"] == m.message_id
        assert m.headers["outbox-topic"] == topic
        sent = datetime.datetime.fromisoformat(m.headers["outbox-created-at"].replace("Z", "+00:00"))
        assert sent == created_at
        assert m.timestamp == int(created_at.timestamp())
    for i, oid in enumerate(with_headers):
        m = next(m for m in messages if m.outbox_id == oid)
        assert m.headers["outbox-id"] == str(oid) and m.headers["outbox-topic"] == row_topic
        assert {k: v for k, v in m.headers.items() if not k.startswith("outbox-")} == {"trace-id": f"t-{i}",
                                                                                       "tenant": "acme"}
        assert sorted(k for k in m.headers if k.startswith("outbox-")) == ["outbox-created-at", "outbox-id",
                                                                            "outbox-key", "outbox-topic"]
    assert relay.alive()
    print(f"\n20,010 events drained {drained_after:.1f}s after the writers finished")


def test_node_killed_mid_drain_and_restarted_nothing_lost_duplicates_reported(db, relays, rabbitmq):
    exchange, queue = unique("outbox"), unique("payments")
    rabbitmq.declare(exchange, queue, "#")
    row_topic = unique("payment")
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange, timeout="2s"),
                               backoff={"initial": "200ms", "max": "2s"}))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=5000, keys=100, topic=row_topic, pause=0.02).start()
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") >= 3000,
               timeout=60, message="3,000 events delivered before the kill")
    rabbitmq.kill()  # SIGKILL mid-drain: the batch in flight loses its broker
    killed_at = time.monotonic()
    done_at_kill = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")
    time.sleep(2)  # the outage the relay must ride out (not a correctness wait)
    # While the node is gone, at most the batches already confirmed complete.
    done_during_outage = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")
    assert done_during_outage - done_at_kill <= 1000, "rows marked done while no broker could confirm them"
    assert relay.alive()
    rabbitmq.restart()
    down_for = time.monotonic() - killed_at
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows after the restart")

    rows = rows_by_id(db)
    assert len(rows) == 20_000
    try:
        assert_no_dead_letters(db)
    except AssertionError as e:  # seen once in CI (16,800 of 20,000): what the relay and the node said
        said = [f"{l.get('ts')} {l.get('msg')}: {str(l.get('error', ''))[:200]}" for l in relay.logs()
                if l.get("level") in ("warn", "error")]
        raise AssertionError(f"{e}; the node was down {down_for:.1f} s; the relay's first warnings: {said[:8]}; "
                             f"the node's log:\n{rabbitmq.log_tail()}") from None
    retried = db.scalar("SELECT count(*) FROM outbox_events WHERE attempts > 0")
    assert retried > 0, "the outage should have made some batches retry"

    messages = read_queue(rabbitmq, queue)
    result = check_order(messages)
    # Every row the relay marked done is in the queue: nothing was marked without a confirm.
    assert result["ids"] == set(rows)
    assert len(messages) == 20_000 + result["duplicates"]
    for m in messages:
        assert m.key == rows[m.outbox_id][1]
    assert relay.alive()
    reconnects = [line for line in relay.logs() if line.get("msg") == "rabbitmq connected"]
    assert len(reconnects) >= 2, "the sink connected again after the restart"
    print(f"\nnode down {down_for:.1f}s; {retried} rows retried; {len(messages)} messages for 20,000 rows: "
          f"{result['duplicates']} at-least-once duplicates")


def test_unroutable_and_oversized_events_are_dead_lettered_at_once_and_the_rest_flow(db, relays, rabbitmq):
    exchange, queue = unique("outbox"), unique("orders")
    rabbitmq.declare(exchange, queue, "order.#")
    # A broker settled long ago (recovery_grace 0s): unroutable is permanent at once. The next test
    # covers the grace.
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange, recovery_grace="0s"), max_attempts=5))
    relay.wait_log("ordering lanes rebalanced")
    big = {"blob": "x" * 1_500_000}  # over the node's max_message_size (1 MiB)
    ids = db.insert([("order.a", "k1", {"n": 1}),
                     ("nobody.listens", "k1", {"n": 2}),  # no binding: returned NO_ROUTE
                     ("order.a", "k1", {"n": 3}),
                     ("order.b", "k2", {"n": 4}),
                     ("order.b", "k2", big),  # the channel is closed: PRECONDITION_FAILED
                     ("order.b", "k2", {"n": 6}),
                     ("order.c", "k3", {"n": 7})])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    rows = rows_by_id(db)
    # rows: topic, aggregate_id, payload, headers, created_at, processed_at, attempts, dead_lettered_at, last_error
    unroutable, oversized = rows[ids[1]], rows[ids[4]]
    for dead in (unroutable, oversized):
        assert dead[7] is not None and dead[5] is None, "dead-lettered, not delivered"
        assert dead[6] == 1, "dead-lettered at the first attempt"
    assert unroutable[8].startswith("rabbitmq: returned by the broker: NO_ROUTE (312)"), unroutable[8]
    assert f"exchange '{exchange}', routing key 'nobody.listens'" in unroutable[8]
    assert oversized[8].startswith("rabbitmq: channel closed by the broker: PRECONDITION_FAILED (406)"), oversized[8]
    delivered = [ids[0], ids[2], ids[3], ids[5], ids[6]]
    for oid in delivered:
        assert rows[oid][5] is not None, f"event {oid} was delivered"
        assert rows[oid][6] == 0, f"event {oid} was delivered at the first attempt"
    messages = read_queue(rabbitmq, queue)
    # Events published before the oversized one in the same batch may arrive twice (their
    # confirms died with the channel); each arrives, in key order, and nothing else does.
    result = check_order(messages)
    assert result["ids"] == set(delivered)
    failed = run_cli("failed", "list", "--json", env={"DATABASE_URL": db.url})
    assert "NO_ROUTE" in failed.stdout and "PRECONDITION_FAILED" in failed.stdout
    assert relay.alive()
    print(f"\nlast_error: {unroutable[8][:120]} | {oversized[8][:120]}; {result['duplicates']} duplicates")


def test_unroutable_events_retry_within_the_recovery_grace_then_dead_letter(db, relays, rabbitmq):
    """Right after the sink connects, NO_ROUTE retries (a restarted broker may still be recovering
    its bindings, a consumer may not have declared its queue yet); a binding that appears within
    recovery_grace gets the events, in key order; a route still missing after it dead-letters."""
    exchange, queue, late_queue = unique("outbox"), unique("orders"), unique("late")
    rabbitmq.declare(exchange, queue, "order.#")
    grace = 8.0
    started = db.scalar("SELECT now()")
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange, recovery_grace=f"{grace:g}s"),
                               max_attempts=100, backoff={"initial": "200ms", "max": "400ms"}))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([("late.a", "k1", {"n": 1}),   # no binding yet: returned NO_ROUTE
                     ("late.a", "k1", {"n": 2}),   # held behind n=1 (same key)
                     ("never.x", "k2", {"n": 3}),  # never bound
                     ("order.a", "k3", {"n": 4})])
    wait_until(lambda: db.scalar(f"SELECT attempts > 0 FROM outbox_events WHERE id = {ids[0]}"),
               timeout=30, message="the unroutable event retried")
    rows = rows_by_id(db)
    # rows: topic, aggregate_id, payload, headers, created_at, processed_at, attempts, dead_lettered_at, last_error
    first = rows[ids[0]]
    assert first[7] is None, "not dead-lettered within the grace"
    assert first[8].startswith("rabbitmq: returned by the broker: NO_ROUTE (312)"), first[8]
    assert f"less than recovery_grace {grace:g}s" in first[8], first[8]
    assert rows[ids[1]][5] is None, "n=2 is not delivered before n=1"
    rabbitmq.declare(exchange, late_queue, "late.#")  # the consumer's queue appears
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")

    rows = rows_by_id(db)
    for oid in (ids[0], ids[1], ids[3]):
        assert rows[oid][5] is not None and rows[oid][7] is None, f"event {oid} was delivered"
    assert rows[ids[3]][6] == 0, "a routable event flows at once"
    late = read_queue(rabbitmq, late_queue)
    assert check_order(late)["ids"] == {ids[0], ids[1]}
    assert [m.outbox_id for m in late][:2] == [ids[0], ids[1]], "k1 in id order"
    assert check_order(read_queue(rabbitmq, queue))["ids"] == {ids[3]}
    never = rows[ids[2]]
    assert never[7] is not None and never[5] is None, "still unroutable after the grace: dead-lettered"
    assert never[6] >= 2, "retried within the grace before it was dead-lettered"
    assert never[8].startswith("rabbitmq: returned by the broker: NO_ROUTE (312)") and "retried" not in never[8]
    assert (never[7] - started).total_seconds() >= grace, "dead-lettered only once the grace had passed"
    assert relay.alive()
    print(f"\nnever-routed event dead-lettered {(never[7] - started).total_seconds():.1f}s after the relay "
          f"started, at attempt {never[6]}; the late binding's events delivered at attempt {rows[ids[0]][6]}")


def test_a_route_that_vanishes_while_connected_retries_within_the_grace_others_dead_letter(db, relays, rabbitmq):
    """On a settled connection, NO_ROUTE for an exchange and routing key that routed a message less
    than recovery_grace ago retries (in a cluster, a restarting node's classic queues vanish from
    its peers' routing until it is back); a route that never routed dead-letters at once."""
    exchange, queue = unique("outbox"), unique("orders")
    rabbitmq.declare(exchange, queue, "order.#")
    grace = 4.0
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange, recovery_grace=f"{grace:g}s"),
                               max_attempts=100, backoff={"initial": "200ms", "max": "400ms"}))
    relay.wait_log("rabbitmq connected")
    time.sleep(grace + 0.5)  # the connection has settled
    first = db.insert([("order.a", "k1", {"n": 1})])[0]
    wait_until(lambda: pending(db) == 0, timeout=30, message="the first event delivered")
    conn = rabbitmq.connection()
    try:
        conn.channel().queue_unbind(queue, exchange, routing_key="order.#")  # the queue vanishes from routing
    finally:
        conn.close()
    ids = db.insert([("order.a", "k1", {"n": 2}),   # order.a routed just now: retried
                     ("order.b", "k2", {"n": 3})])  # order.b never routed: dead-lettered at once
    wait_until(lambda: db.scalar(f"SELECT attempts > 0 FROM outbox_events WHERE id = {ids[0]}"),
               timeout=30, message="the vanished route's event retried")
    wait_until(lambda: db.scalar(f"SELECT dead_lettered_at IS NOT NULL FROM outbox_events WHERE id = {ids[1]}"),
               timeout=30, message="the never-routed event dead-lettered")
    rows = rows_by_id(db)
    # rows: topic, aggregate_id, payload, headers, created_at, processed_at, attempts, dead_lettered_at, last_error
    retried, dead = rows[ids[0]], rows[ids[1]]
    assert retried[7] is None and "retried: this exchange and routing key routed a message" in retried[8], retried[8]
    assert dead[6] == 1 and dead[8].startswith("rabbitmq: returned by the broker: NO_ROUTE (312)"), dead
    assert "retried" not in dead[8]
    rabbitmq.declare(exchange, queue, "order.#")  # the node is back
    wait_until(lambda: pending(db) == 0, timeout=30, message="no pending rows")
    rows = rows_by_id(db)
    assert rows[ids[0]][5] is not None and rows[ids[0]][7] is None, "delivered once its route was back"
    messages = read_queue(rabbitmq, queue)
    assert check_order(messages)["ids"] == {first, ids[0]}
    assert relay.alive()
    print(f"\nvanished route: delivered at attempt {rows[ids[0]][6]}; never-routed: {dead[8][:90]}")


def test_a_nacked_event_holds_its_key_while_later_batches_are_pipelined_and_other_keys_flow(db, relays, rabbitmq):
    """Issue 45: batches are pipelined into RabbitMQ (the next enters the channel while the previous
    one's confirms are outstanding). An event the queue refuses (basic.nack: x-overflow
    reject-publish, and the message does not fit in x-max-length-bytes) while later events of its
    key and of other keys are in flight: the key's later events never reach the queue before it,
    whether they are in later batches or in its own (a second key has its refused event and a later
    one in one batch); the other keys are not held. One queue: its order is the consumer's."""
    exchange, queue = unique("outbox"), unique("limited")
    # The queue holds 150,000 bytes of message bodies and nacks a publish that would pass that. A
    # filler of 100,000 at its head leaves room for the small events (~33,000 bytes) but not for a
    # 55,000-byte one; once the test takes the filler, both 55,000-byte events fit.
    rabbitmq.declare(exchange, queue, "#",
                     queue_args={"x-max-length-bytes": 150_000, "x-overflow": "reject-publish"})
    conn = rabbitmq.connection()
    try:
        conn.channel().basic_publish("", queue, b"f" * 100_000, pika.BasicProperties(message_id="filler"))
    finally:
        conn.close()
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange), max_attempts=50,
                               backoff={"initial": "300ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")
    key, key2 = unique("held"), unique("same-batch")
    big = {"blob": "x" * 55_000}
    # 3,000 events in one transaction: full batches of 500, one after the other in the pipeline.
    # The held key's events are more than a batch apart, so each of them is in a batch of its own.
    held_at = {100: (key, False), 600: (key, True), 1150: (key, False), 1700: (key, False), 2600: (key, False),
               2000: (key2, True), 2001: (key2, False), 2300: (key2, False)}
    rows = []
    for i in range(3000):
        k, large = held_at.get(i, (f"other-{i % 50}", False))
        rows.append(("order.paid", k, big if large else {"n": i}))
    ids = db.insert(rows)
    held_ids = [ids[i] for i in sorted(held_at) if held_at[i][0] == key]
    held2_ids = [ids[i] for i in sorted(held_at) if held_at[i][0] == key2]
    other_ids = [oid for i, oid in enumerate(ids) if i not in held_at]

    check_failed_events_hold_their_keys(db, held_ids, held2_ids, other_ids, "nacked", "basic.nack")

    conn = rabbitmq.connection()
    try:
        method, props, _ = conn.channel().basic_get(queue, auto_ack=True)  # the head: the filler
        assert props.message_id == "filler"
    finally:
        conn.close()
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    messages = read_queue(rabbitmq, queue)
    # per key in id order, in the queue's order
    check_held_keys_caught_up(db, messages, check_order(messages), ids, {key: held_ids, key2: held2_ids})
    assert relay.alive()


def test_key_order_channel_publishes_a_keys_events_back_to_back_in_key_order(db, relays, rabbitmq):
    """key_order: channel (the sink before issue 45): a batch's events of one key go out back to
    back on the channel, pipelined with the next batch; the queue still has every key in id order."""
    exchange, queue = unique("outbox"), unique("orders")
    rabbitmq.declare(exchange, queue, "#")
    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.url, exchange, key_order="channel")))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([("order.paid", f"k{i % 5}", {"n": i}) for i in range(3000)])  # 100 events a key a batch
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    assert db.scalar("SELECT max(attempts) FROM outbox_events") == 0
    messages = read_queue(rabbitmq, queue)
    result = check_order(messages)
    assert result["duplicates"] == 0 and result["ids"] == set(ids)
    assert relay.alive()


def test_tls_with_a_client_certificate_and_a_bad_certificate_refused(db, relays, rabbitmq):
    """amqps:// verifies the broker's chain and name by default; the events flow over TLS only with
    the right CA, the broker's name and the client certificate the broker demands."""
    exchange, queue = unique("outbox"), unique("tls")
    rabbitmq.declare(exchange, queue, "#")
    t = rabbitmq.tls
    client = {"cert_file": t["client_cert"], "key_file": t["client_key"]}

    def connect_error(url, tls):
        relay = relays(base_config(db, rabbitmq_sink(url, exchange, tls=tls, timeout="2s")))
        line = relay.wait_log("rabbitmq: cannot connect")
        relay.stop()
        assert not any(line.get("msg") == "rabbitmq connected" for line in relay.logs())
        return line["error"]

    # The system CA store does not know the test's CA.
    error = connect_error(rabbitmq.tls_url(), client)
    assert "certificate verification failed: self-signed certificate in certificate chain" in error, error
    # The right CA, but a name the certificate does not carry (it is for IP 127.0.0.1).
    error = connect_error(rabbitmq.tls_url("localhost"), {"ca_file": t["ca"], **client})
    assert "certificate verification failed: hostname mismatch" in error, error
    # Verified, but without the client certificate the broker demands (with TLS 1.3 the broker's
    # refusal arrives after the client's side of the handshake: at the login).
    error = connect_error(rabbitmq.tls_url(), {"ca_file": t["ca"]})
    assert "SSL error" in error and "certificate verification failed" not in error, error

    relay = relays(base_config(db, rabbitmq_sink(rabbitmq.tls_url(), exchange, tls={"ca_file": t["ca"], **client})))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([(f"tls.{i % 3}", f"k{i % 5}", {"n": i}) for i in range(50)])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    assert_no_dead_letters(db)
    result = check_order(read_queue(rabbitmq, queue))
    assert result["ids"] == set(ids)
    connected = relay.wait_log("rabbitmq connected")
    assert connected["url"] == f"amqps://relay:*****@127.0.0.1:{rabbitmq.tls_port}/"
    assert not any(rabbitmq.password in json.dumps(line) for line in relay.logs())
    assert relay.alive()


def test_bad_rabbitmq_config_exits_2_naming_the_key(db, workdir):
    cases = (
        ({"name": "r", "type": "rabbitmq", "exchange": "x"}, "sinks[0].url: required"),
        (rabbitmq_sink("http://127.0.0.1:5672", "x")[0], "sinks[0].url: expected amqp://"),
        (rabbitmq_sink("amqp://127.0.0.1", "x", tls={"ca_file": "/x.pem"})[0],
         "sinks[0].tls: TLS settings apply to amqps:// urls only"),
        (rabbitmq_sink("amqps://127.0.0.1", "x", tls={"ca_file": "/nonexistent/ca.pem"})[0],
         "sinks[0].tls.ca_file: cannot read /nonexistent/ca.pem"),
        ({"name": "r", "type": "rabbitmq", "url": "amqp://127.0.0.1"}, "sinks[0].exchange: required"),
        (rabbitmq_sink("amqp://127.0.0.1", "events/{topic}")[0], "sinks[0].exchange: unexpected '/'"),
        (rabbitmq_sink("amqp://127.0.0.1", "x", routing_key="{id}")[0], "sinks[0].routing_key: unexpected '{'"),
        (rabbitmq_sink("amqp://127.0.0.1", "x", timeout="1ms")[0], "sinks[0].timeout: expected 100ms to 10m"),
        (rabbitmq_sink("amqp://127.0.0.1", "x", max_in_flight=0)[0], "sinks[0].max_in_flight"),
        (rabbitmq_sink("amqp://127.0.0.1", "x", mandatory=False)[0], "sinks[0].mandatory: unknown key"),
    )
    for sink, expected in cases:
        proc = run_config(workdir, base_config(db, [sink]), timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert expected in proc.stderr, proc.stderr
    # A bad URL never shows its password.
    proc = run_config(workdir, base_config(db, rabbitmq_sink("amqp://u:pw-in-a-bad-url@h:port/", "x")), timeout=30)
    assert proc.returncode == 2
    assert "pw-in-a-bad-url" not in proc.stderr


def test_rabbitmq_password_never_reaches_the_logs(db, relays, rabbitmq):
    exchange, queue = unique("outbox"), unique("secret")
    rabbitmq.declare(exchange, queue, "#")
    # The password from the environment; a second sink with a wrong password makes the sink log
    # its login failures too.
    wrong = "wrong-" + uuid.uuid4().hex
    sinks = rabbitmq_sink(f"amqp://relay:${{RMQ_PASSWORD}}@127.0.0.1:{rabbitmq.port}/", exchange)
    sinks.append({"name": "rabbitmq-bad", "type": "rabbitmq", "exchange": exchange, "timeout": "1s",
                  "url": f"amqp://relay:{wrong}@127.0.0.1:{rabbitmq.port}/"})
    config = base_config(db, sinks)
    config["routes"] = [{"topics": ["ok.*"], "sinks": ["rabbitmq"]}, {"topics": ["bad.*"], "sinks": ["rabbitmq-bad"]}]
    config["log"] = {"level": "debug"}
    relay = relays(config, env={"RMQ_PASSWORD": rabbitmq.password})
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([("ok.one", "k", {"n": 1}), ("bad.one", "k2", {"n": 2})])
    wait_until(lambda: db.scalar("SELECT processed_at IS NOT NULL FROM outbox_events WHERE id = %s", (ids[0],)),
               timeout=30, message="delivered")
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (ids[1],)) >= 1,
               timeout=30, message="the event for the wrong password retried")
    assert relay.stop() == 0
    logs = relay.raw_logs()
    assert rabbitmq.password not in logs
    assert wrong not in logs
    assert "ACCESS_REFUSED" in logs  # the login failure is logged, without the password
    started = next(l for l in relay.logs() if l.get("msg") == "starting outbox-relay")
    assert started["config"]["sinks"][0]["url"] == f"amqp://relay:*****@127.0.0.1:{rabbitmq.port}/"
    assert started["config"]["sinks"][1]["url"] == f"amqp://relay:*****@127.0.0.1:{rabbitmq.port}/"
    last_error = db.scalar("SELECT last_error FROM outbox_events WHERE id = %s", (ids[1],))
    assert "ACCESS_REFUSED" in last_error and wrong not in last_error
    assert [m.outbox_id for m in read_queue(rabbitmq, queue)] == [ids[0]]
