"""Issue 3: the Kafka sink with the real relay binary, a real Postgres and a real Apache Kafka
broker (KRaft, single node, started by the test run through tests/kafka/broker.sh).

The fault-injection cases against librdkafka's mock cluster (issue test 3) are C++ unit tests:
tests/unit/sinks/kafka/kafka_sink_mock_test.cpp (doctest suite "kafka-mock")."""
from __future__ import annotations

import datetime
import json
import time
import uuid

import pytest

from conftest import Writers, assert_no_dead_letters, base_config, pending, rows_by_id, run_cli, unique, wait_until
from kafka_fixtures import check_order, kafka_broker, own_kafka_broker, read_topic, strict_kafka_broker  # noqa: F401


def kafka_sink(bootstrap, topic="outbox.{topic}", **extra):
    sink = {"name": "kafka", "type": "kafka", "brokers": bootstrap, "topic": topic}
    sink.update(extra)
    return [sink]


def test_1_fifty_thousand_events_from_8_writers_reach_the_topic_once_in_key_order(db, relays, kafka_broker):
    row_topic = unique("order")
    kafka_topic = "outbox." + row_topic
    kafka_broker.create_topic(kafka_topic, partitions=6)
    relay = relays(base_config(db, kafka_sink(kafka_broker.bootstrap)))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=8, per_writer=6250, keys=200, topic=row_topic).start()
    # Headers the sink reserves (issue 43): outbox-* in any case (Java's lastHeader("outbox-id")
    # would read the writer's value) and ce_* (a CloudEvents deserializer would read the record as
    # an event). Dropped; the others travel.
    spoofed = {"outbox-id": "999999", "Outbox-Topic": "spoofed", "ce_specversion": "1.0", "ce_id": "forged"}
    with_headers = db.insert([(row_topic, f"key-{i}", {"special": i},
                               {"trace-id": f"t-{i}", "tenant": "acme", **spoofed}) for i in range(10)])
    writers.join()
    started = time.monotonic()
    wait_until(lambda: pending(db) == 0, timeout=240, message="no pending rows")
    drained_after = time.monotonic() - started
    assert_no_dead_letters(db)
    assert db.scalar("SELECT count(*) FROM outbox_events") == 50_010

    messages = read_topic(kafka_broker.bootstrap, kafka_topic)
    assert len(messages) == 50_010, "exactly one message per event"
    result = check_order(messages)
    assert result["duplicates"] == 0
    rows = rows_by_id(db)
    assert result["ids"] == set(rows)

    for m in messages:
        topic, key, payload, _, created_at, *_ = rows[m.outbox_id]
        assert m.key == key
        assert m.value.decode() == payload  # the payload's JSON text as Postgres renders it
        names = [n for n, _ in m.headers]
        assert names[:3] == ["outbox-id", "outbox-topic", "outbox-created-at"]
        assert m.header("outbox-topic") == topic
        sent = datetime.datetime.fromisoformat(m.header("outbox-created-at").replace("Z", "+00:00"))
        assert sent == created_at
    for i, oid in enumerate(with_headers):
        m = next(m for m in messages if m.outbox_id == oid)
        assert [n for n, _ in m.headers[:3]] == ["outbox-id", "outbox-topic", "outbox-created-at"]
        assert m.header("outbox-id") == str(oid)
        assert dict((n, v.decode()) for n, v in m.headers[3:]) == {"trace-id": f"t-{i}", "tenant": "acme"}
    assert any(l.get("msg", "").startswith("a row header carries a name the sink reserves") for l in relay.logs())
    assert relay.alive()
    print(f"\n50,010 events drained {drained_after:.1f}s after the writers finished")


def test_2_broker_killed_mid_run_and_restarted_no_row_done_without_ack(db, relays, own_kafka_broker):
    broker = own_kafka_broker
    row_topic = unique("payment")
    kafka_topic = "outbox." + row_topic
    broker.create_topic(kafka_topic, partitions=3)
    relay = relays(base_config(db, kafka_sink(broker.bootstrap, delivery_timeout="2s"),
                               backoff={"initial": "200ms", "max": "2s"}))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=5000, keys=100, topic=row_topic, pause=0.02).start()
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") >= 3000,
               timeout=60, message="3,000 events delivered before the kill")
    broker.kill()  # SIGKILL mid-run: batches in flight lose their broker
    killed_at = time.monotonic()
    done_at_kill = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")
    time.sleep(3)  # the outage the relay must ride out (not a correctness wait)
    # While the broker is gone, at most the batch that was already acknowledged completes.
    done_during_outage = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")
    assert done_during_outage - done_at_kill <= 500, "rows marked done while no broker could acknowledge them"
    broker.restart()
    down_for = time.monotonic() - killed_at
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=240, message="no pending rows after the restart")

    rows = rows_by_id(db)
    assert len(rows) == 20_000
    assert_no_dead_letters(db)
    retried = db.scalar("SELECT count(*) FROM outbox_events WHERE attempts > 0")
    assert retried > 0, "the outage should have made some batches retry"

    messages = read_topic(broker.bootstrap, kafka_topic)
    result = check_order(messages)
    # Every row the relay marked done is in the topic: nothing was marked without Kafka's ack.
    assert result["ids"] == set(rows)
    for m in messages:
        assert m.key == rows[m.outbox_id][1]
    assert relay.alive()
    print(f"\nbroker down {down_for:.1f}s; {retried} rows retried; {len(messages)} messages for 20,000 rows: "
          f"{result['duplicates']} at-least-once duplicates")


@pytest.mark.parametrize("limit", ["producer", "broker"])
def test_4_message_over_the_limit_is_dead_lettered_at_once_and_the_rest_flow(db, relays, kafka_broker, limit):
    # "producer": librdkafka refuses it against message.max.bytes (1,000,000 by default).
    # "broker": the producer allows 5 MB, so the broker refuses it (its limit is 1,048,588 bytes).
    row_topic = unique("big")
    kafka_topic = "outbox." + row_topic
    kafka_broker.create_topic(kafka_topic, partitions=2)
    properties = {"message.max.bytes": "5000000"} if limit == "broker" else {}
    relay = relays(base_config(db, kafka_sink(kafka_broker.bootstrap, delivery_timeout="10s", properties=properties),
                               max_attempts=5))
    relay.wait_log("ordering lanes rebalanced")
    big = {"blob": "x" * 1_500_000}
    ids = db.insert([(row_topic, "k1", {"n": 1}), (row_topic, "k1", big), (row_topic, "k1", {"n": 3}),
                     (row_topic, "k2", {"n": 4}), (row_topic, "k2", {"n": 5})])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    rows = rows_by_id(db)
    # rows: topic, aggregate_id, payload, headers, created_at, processed_at, attempts, dead_lettered_at, last_error
    dead = rows[ids[1]]
    assert dead[7] is not None and dead[5] is None, "the oversized event is dead-lettered, not delivered"
    assert dead[6] == 1, "dead-lettered at the first attempt"
    assert dead[8].startswith("kafka: MSG_SIZE_TOO_LARGE"), dead[8]
    for oid in ids[:1] + ids[2:]:
        assert rows[oid][5] is not None, f"event {oid} after the oversized one was delivered"
        assert rows[oid][6] == 0
    messages = read_topic(kafka_broker.bootstrap, kafka_topic)
    assert sorted(m.outbox_id for m in messages) == [ids[0], ids[2], ids[3], ids[4]]
    check_order(messages)
    # The operator sees why: `outbox-relay failed list` shows the librdkafka error name.
    failed = run_cli("failed", "list", "--json", env={"DATABASE_URL": db.url})
    assert "MSG_SIZE_TOO_LARGE" in failed.stdout
    print(f"\n[{limit}] last_error: {dead[8][:160]}")


def test_bad_kafka_config_exits_2_naming_the_key(db, workdir):
    no_brokers = {"name": "kafka", "type": "kafka", "topic": "outbox.{topic}"}
    for sink, key in ((no_brokers, "sinks[0].brokers: required"),
                      (kafka_sink("127.0.0.1:9092", topic="events/{topic}")[0], "sinks[0].topic"),
                      (kafka_sink("127.0.0.1:9092", properties={"compresion.type": "zstd"})[0],
                       "sinks[0].properties.compresion.type"),
                      (kafka_sink("127.0.0.1:9092", properties={"acks": "1"})[0], "sinks[0]: cannot create")):
        config = workdir / f"bad-{uuid.uuid4().hex[:6]}.yaml"
        config.write_text(json.dumps(base_config(db, [sink])))
        proc = run_cli("run", "--config", str(config), check=False, timeout=30)
        assert proc.returncode == 2, proc.stderr
        assert key in proc.stderr, proc.stderr


def test_kafka_secrets_never_reach_the_logs(db, relays, kafka_broker):
    secret = "kafka-" + uuid.uuid4().hex
    config = base_config(db, kafka_sink(kafka_broker.bootstrap, properties={
        "sasl.username": "relay", "sasl.password": "${KAFKA_SASL_PASSWORD}", "debug": "conf,broker"}))
    config["log"] = {"level": "debug"}  # librdkafka's debug lines, its config dump among them, reach the log
    relay = relays(config, env={"KAFKA_SASL_PASSWORD": secret})
    relay.wait_log("kafka producer created")
    row_topic = unique("secret")
    db.insert([(row_topic, "k", {"n": 1})])
    wait_until(lambda: pending(db) == 0, timeout=60, message="delivered")
    assert relay.stop() == 0
    logs = relay.raw_logs()
    assert secret not in logs
    started = next(l for l in relay.logs() if l.get("msg") == "starting outbox-relay")
    assert started["config"]["sinks"][0]["properties"]["sasl.password"] == "*****"
    assert "librdkafka:" in logs  # librdkafka's own lines went through the same redacting log


def test_sigterm_while_the_broker_is_down_exits_0_within_the_bound_and_marks_nothing(db, relays, own_kafka_broker):
    broker = own_kafka_broker
    row_topic = unique("shutdown")
    kafka_topic = "outbox." + row_topic
    broker.create_topic(kafka_topic, partitions=2)
    config = base_config(db, kafka_sink(broker.bootstrap), shutdown_timeout="8s")
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    first = db.insert([(row_topic, f"k{i % 5}", {"n": i}) for i in range(100)])
    wait_until(lambda: pending(db) == 0, timeout=60, message="first 100 delivered")

    broker.kill()
    second = db.insert([(row_topic, f"k{i % 5}", {"n": 100 + i}) for i in range(100)])
    # SIGTERM while the relay holds the new rows and waits for Kafka acks that cannot come.
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE id = ANY(%s) AND lease_owner IS NOT NULL",
                                 (second,)) > 0, timeout=30, message="the relay claimed the new rows")
    t0 = time.monotonic()
    code = relay.stop(timeout=30)
    took = time.monotonic() - t0
    assert code == 0
    assert took < 8 + 2, f"shutdown took {took:.1f}s"
    done = db.scalar("SELECT count(*) FROM outbox_events WHERE id = ANY(%s) AND processed_at IS NOT NULL", (second,))
    assert done == 0, "no row may be marked done while the broker is down"
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE lease_owner IS NOT NULL") == 0, "leases released"

    broker.restart()
    relays(config).wait_log("ordering lanes rebalanced")
    wait_until(lambda: pending(db) == 0, timeout=120, message="the rest delivered after the restart")
    messages = read_topic(broker.bootstrap, kafka_topic)
    result = check_order(messages)
    assert result["ids"] == set(first) | set(second)
    print(f"\nSIGTERM during the outage: exit 0 after {took:.1f}s; {result['duplicates']} duplicates")


@pytest.mark.parametrize("together", [False, True], ids=["later-batches", "one-batch"])
def test_a_failing_event_holds_its_key_later_events_and_no_other_key(db, relays, strict_kafka_broker, together):
    """Issue 45: with batches pipelined through the kafka sink, one event fails again and again (its
    topic does not exist and the broker creates none: UNKNOWN_TOPIC_OR_PART, retriable) while later
    events of its key (to a topic that exists) and of other keys are claimed behind it. The key's
    later events reach Kafka only after it (broker append times); other keys flow on.
    later-batches: the key's later events are committed after it, so they are claimed into the next
    batches, in the sink while it is (the pipeline's per-key wait). one-batch: committed with it, so
    they are in its batch, bound for another topic (another partition, which Kafka does not order
    against the first: the sink must not send them beside it)."""
    broker = strict_kafka_broker
    ok_topic, stuck_topic = unique("flow"), unique("stuck")
    log_append = {"message.timestamp.type": "LogAppendTime"}
    broker.create_topic("outbox." + ok_topic, partitions=3, config=log_append)
    relay = relays(base_config(db, kafka_sink(broker.bootstrap, delivery_timeout="2s"), batch_size=100,
                               max_attempts=1000, backoff={"initial": "200ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=2, per_writer=1500, keys=20, topic=ok_topic, batch=5, pause=0.01).start()
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") >= 100,
               timeout=60, message="the other keys flowing")
    if together:
        first, *later = db.insert([(stuck_topic, "held", {"n": 1})] + [(ok_topic, "held", {"n": n}) for n in range(2, 6)])
    else:
        [first] = db.insert([(stuck_topic, "held", {"n": 1})])
        later = db.insert([(ok_topic, "held", {"n": n}) for n in range(2, 6)])
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (first,)) >= 2, timeout=60,
               message="the first event of the key failed twice")
    flowed = db.scalar("SELECT count(*) FROM outbox_events WHERE aggregate_id <> 'held' AND id > %s "
                       "AND processed_at IS NOT NULL", (later[-1],))
    held_early = [m for m in read_topic(broker.bootstrap, "outbox." + ok_topic) if m.key == "held"]
    assert held_early == [], "a later event of the key reached Kafka while its first event was failing"
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE id = ANY(%s) AND processed_at IS NOT NULL",
                     (later,)) == 0
    assert flowed > 0, "other keys were held while one key's event failed"
    last_error = db.scalar("SELECT last_error FROM outbox_events WHERE id = %s", (first,))
    assert "UNKNOWN_TOPIC" in last_error, last_error

    broker.create_topic("outbox." + stuck_topic, partitions=1, config=log_append)
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows once the topic exists")
    assert_no_dead_letters(db)

    stuck = read_topic(broker.bootstrap, "outbox." + stuck_topic)
    flow = read_topic(broker.bootstrap, "outbox." + ok_topic)
    assert [m.outbox_id for m in stuck] == [first]
    held_later = sorted((m for m in flow if m.key == "held"), key=lambda m: m.offset)
    assert [m.outbox_id for m in held_later] == later, "the key's later events, once each, in id order"
    assert stuck[0].timestamp_ms <= held_later[0].timestamp_ms, "a later event of the key was appended first"
    result = check_order(flow)
    assert result["ids"] | {first} == set(rows_by_id(db))
    attempts = db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (first,))
    print(f"\nthe failing event took {attempts} attempts; {flowed} events of other keys delivered behind it "
          f"meanwhile; {result['duplicates']} duplicates")
