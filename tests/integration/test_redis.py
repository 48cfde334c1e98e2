"""Issue 13: the Redis Streams sink with the real relay binary, a real Postgres and a real
redis-server (started by the test run on a free 127.0.0.1 port, see redis_fixtures.py). The
streams are read back with redis-py, Redis's own Python client."""
from __future__ import annotations

import datetime
import json
import time
import urllib.error
import urllib.request
import uuid

from conftest import (Writers, assert_no_dead_letters, base_config, free_port, make_tls_files, pending, run_cli,
                      run_config, unique, wait_until)
from redis_fixtures import check_order, entry_headers, own_redis_server, read_stream, redis_server  # noqa: F401


def redis_sink(url, stream="outbox.{topic}", **extra):
    sink = {"name": "redis", "type": "redis", "url": url, "stream": stream}
    sink.update(extra)
    return [sink]


def rows_by_id(db):
    return {r[0]: r[1:] for r in db.query(
        "SELECT id, topic, aggregate_id, payload::text, headers, created_at, processed_at, attempts, "
        "dead_lettered_at, last_error FROM outbox_events")}


def test_20000_events_from_4_writers_reach_the_stream_exactly_once_in_key_order(db, relays, redis_server):
    row_topic = unique("order")
    stream = "outbox." + row_topic
    relay = relays(base_config(db, redis_sink(redis_server.url)))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=4995, keys=200, topic=row_topic).start()
    with_headers = db.insert([(row_topic, f"key-{i}", {"special": i}, {"trace-id": f"t-{i}", "tenant": "acme"})
                              for i in range(20)])
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows")
    assert_no_dead_letters(db)
    assert db.scalar("SELECT count(*) FROM outbox_events") == 20_000

    with redis_server.client() as client:
        entries = read_stream(client, stream)
    assert len(entries) == 20_000, "exactly one entry per event"
    result = check_order(entries)
    assert result["duplicates"] == 0
    rows = rows_by_id(db)
    assert result["ids"] == set(rows)
    for e in entries:
        topic, key, payload, headers, created_at, *_ = rows[e.outbox_id]
        assert list(e.fields) == ["id", "topic", "key", "payload", "headers", "created_at"]
        assert e.fields["topic"] == topic
        assert e.key == key
        assert e.fields["payload"] == payload  # the payload's JSON text as Postgres renders it
        assert entry_headers(e) == headers
        sent = datetime.datetime.fromisoformat(e.fields["created_at"].replace("Z", "+00:00"))
        assert sent == created_at
    by_id = {e.outbox_id: e for e in entries}
    for i, oid in enumerate(with_headers):
        assert entry_headers(by_id[oid]) == {"trace-id": f"t-{i}", "tenant": "acme"}
    assert relay.alive()


def test_redis_killed_mid_drain_and_restarted_nothing_lost(db, relays, own_redis_server):
    server = own_redis_server().start()
    row_topic = unique("payment")
    stream = "outbox." + row_topic
    relay = relays(base_config(db, redis_sink(server.url, timeout="1s"), backoff={"initial": "200ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")

    writers = Writers(db, count=4, per_writer=5000, keys=100, topic=row_topic, pause=0.01).start()
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") >= 3000,
               timeout=60, message="3,000 events delivered before the kill")
    server.kill()  # SIGKILL mid-drain: the batch in flight loses its server
    killed_at = time.monotonic()
    done_at_kill = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")
    time.sleep(2)  # the outage the relay must ride out (not a correctness wait)
    # While Redis is gone, at most the batch that was already acknowledged completes.
    done_during_outage = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL")
    assert done_during_outage - done_at_kill <= 500, "rows marked done while no server could acknowledge them"
    assert relay.wait_log("redis connection lost")
    server.restart()
    down_for = time.monotonic() - killed_at
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows after the restart")

    rows = rows_by_id(db)
    assert len(rows) == 20_000
    assert_no_dead_letters(db)
    retried = db.scalar("SELECT count(*) FROM outbox_events WHERE attempts > 0")
    assert retried > 0, "the outage should have made some batches retry"
    with server.client() as client:
        entries = read_stream(client, stream)
    result = check_order(entries)
    # Every row the relay marked done is in the stream: nothing was marked without Redis's reply,
    # and nothing Redis acknowledged was lost (appendfsync always).
    assert result["ids"] == set(rows)
    assert len(entries) == 20_000 + result["duplicates"]
    for e in entries:
        assert e.key == rows[e.outbox_id][1]
    assert relay.alive()
    print(f"\nredis down {down_for:.1f}s; {retried} rows retried; {len(entries)} entries for 20,000 rows: "
          f"{result['duplicates']} at-least-once duplicates")


def test_wrongtype_stream_is_dead_lettered_at_once_and_the_rest_flow(db, relays, redis_server):
    good, poison = unique("good"), unique("poison")
    with redis_server.client() as client:
        client.set("outbox." + poison, "not a stream")  # XADD to it: WRONGTYPE
    relay = relays(base_config(db, redis_sink(redis_server.url), max_attempts=5))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([(good, "k1", {"n": 1}), (poison, "k1", {"n": 2}), (good, "k1", {"n": 3}),
                     (good, "k2", {"n": 4}), (poison, "k2", {"n": 5}), (good, "k2", {"n": 6})])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    rows = rows_by_id(db)
    # rows: topic, aggregate_id, payload, headers, created_at, processed_at, attempts, dead_lettered_at, last_error
    for oid in (ids[1], ids[4]):
        assert rows[oid][7] is not None and rows[oid][5] is None, "the poison event is dead-lettered, not delivered"
        assert rows[oid][6] == 1, "dead-lettered at the first attempt"
        assert rows[oid][8].startswith("redis: WRONGTYPE"), rows[oid][8]
    for oid in (ids[0], ids[2], ids[3], ids[5]):
        assert rows[oid][5] is not None and rows[oid][6] == 0, f"event {oid} delivered at the first attempt"
    with redis_server.client() as client:
        entries = read_stream(client, "outbox." + good)
    assert [e.outbox_id for e in entries] == [ids[0], ids[2], ids[3], ids[5]]
    failed = run_cli("failed", "list", "--json", env={"DATABASE_URL": db.url})
    assert "WRONGTYPE" in failed.stdout


def test_acl_user_auth_noperm_key_dead_lettered_and_password_never_logged(db, relays, own_redis_server):
    server = own_redis_server().start()
    password = "redis-" + uuid.uuid4().hex
    with server.client() as client:
        client.execute_command("ACL", "SETUSER", "admin", "on", ">admin-pw-1234", "~*", "&*", "+@all")
        client.execute_command("ACL", "SETUSER", "relay", "on", ">" + password, "~allowed.*",
                               "+ping", "+select", "+multi", "+exec", "+xadd")
        client.execute_command("ACL", "SETUSER", "default", "off")
    server.admin = ("admin", "admin-pw-1234")
    config = base_config(db, redis_sink(f"redis://relay:${{REDIS_PASSWORD}}@127.0.0.1:{server.port}/0",
                                        stream="{topic}"))
    config["log"] = {"level": "debug"}
    relay = relays(config, env={"REDIS_PASSWORD": password})
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([("allowed.a", "k", {"n": 1}), ("denied.b", "k", {"n": 2}), ("allowed.a", "k", {"n": 3})])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    rows = rows_by_id(db)
    assert rows[ids[1]][7] is not None and rows[ids[1]][8].startswith("redis: NOPERM"), rows[ids[1]]
    assert rows[ids[1]][6] == 1, "dead-lettered at the first attempt"
    assert rows[ids[0]][5] is not None and rows[ids[2]][5] is not None
    assert rows[ids[0]][6] == 0 and rows[ids[2]][6] == 0, "the rest delivered at the first attempt"
    with server.client() as client:
        assert [e.outbox_id for e in read_stream(client, "allowed.a")] == [ids[0], ids[2]]
        assert not client.exists("denied.b")
    assert relay.stop() == 0
    assert password not in relay.raw_logs()
    started = next(l for l in relay.logs() if l.get("msg") == "starting outbox-relay")
    assert started["config"]["sinks"][0]["url"] == f"redis://relay:*****@127.0.0.1:{server.port}/0"

    # A wrong password: every event retries (not dead-lettered), and the password is not logged.
    wrong = "wrong-" + uuid.uuid4().hex
    config = base_config(db, redis_sink(f"redis://relay:{wrong}@127.0.0.1:{server.port}", stream="{topic}"))
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    late = db.insert([("allowed.a", "k", {"n": 4})])[0]
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (late,)) >= 1, timeout=30,
               message="a failed attempt")
    row = rows_by_id(db)[late]
    assert row[7] is None and row[5] is None and "WRONGPASS" in row[8], row
    assert relay.stop() == 0
    assert wrong not in relay.raw_logs()
    assert wrong not in row[8]


def test_tls_with_client_certificate(db, relays, own_redis_server, workdir):
    tls = make_tls_files(workdir / "tls")
    server = own_redis_server(tls=tls).start()
    row_topic = unique("tls")
    sink_tls = {"ca_file": tls["ca"], "cert_file": tls["client_cert"], "key_file": tls["client_key"]}
    relay = relays(base_config(db, redis_sink(server.url, tls=sink_tls)))
    relay.wait_log("ordering lanes rebalanced")
    ids = db.insert([(row_topic, f"k{i % 3}", {"n": i}) for i in range(100)])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    with server.client() as client:
        entries = read_stream(client, "outbox." + row_topic)
    assert [e.outbox_id for e in entries] == ids
    assert relay.stop() == 0

    # Without the CA the server's certificate is refused: events retry, nothing is delivered.
    relay = relays(base_config(db, redis_sink(server.url, tls={"cert_file": tls["client_cert"],
                                                               "key_file": tls["client_key"]})))
    relay.wait_log("ordering lanes rebalanced")
    late = db.insert([(row_topic, "k0", {"n": 100})])[0]
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (late,)) >= 1, timeout=30,
               message="a failed attempt")
    row = rows_by_id(db)[late]
    assert row[5] is None and row[7] is None and "certificate verification failed" in row[8], row
    relay.stop()


def test_maxlen_trims_the_stream_approximately(db, relays, redis_server):
    row_topic = unique("trim")
    relay = relays(base_config(db, redis_sink(redis_server.url, maxlen=100)))
    relay.wait_log("ordering lanes rebalanced")
    db.insert([(row_topic, f"k{i % 7}", {"n": i}) for i in range(1000)])
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    with redis_server.client() as client:
        length = client.xlen("outbox." + row_topic)
    # MAXLEN ~ 100 trims whole nodes of 100 entries (stream-node-max-entries): 100 to 199 are left.
    assert 100 <= length < 200, length


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


def test_readyz_follows_the_redis_server(db, relays, own_redis_server):
    server = own_redis_server().start()
    port = free_port()
    config = base_config(db, redis_sink(server.url))
    config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
    relay = relays(config)
    wait_until(lambda: readyz(port)[0] == 200, timeout=30, message="/readyz 200")
    server.kill()
    status, body = wait_until(lambda: (r := readyz(port))[0] == 503 and r, timeout=10, message="/readyz 503")
    assert body["reasons"] == ["sink 'redis' not usable"]
    server.restart()
    wait_until(lambda: readyz(port)[0] == 200, timeout=10, message="/readyz 200 after the restart")
    assert relay.alive()


def test_bad_redis_config_exits_2_naming_the_key(db, workdir):
    cases = [
        ({"name": "r", "type": "redis"}, "sinks[0].url: required"),
        (redis_sink("http://u:hunter2-pw@127.0.0.1:6379")[0], "sinks[0].url: unsupported scheme"),
        (redis_sink("redis://127.0.0.1:99999")[0], "sinks[0].url: the port must be a number"),
        (redis_sink("redis://127.0.0.1", stream="outbox.{topc}")[0], "sinks[0].stream: unexpected '{'"),
        (redis_sink("redis://127.0.0.1", maxlen=0)[0], "sinks[0].maxlen: expected a whole number"),
        (redis_sink("redis://127.0.0.1", timeout="10ms")[0], "sinks[0].timeout: expected a duration from 100ms"),
        (redis_sink("redis://127.0.0.1", tls={"ca_file": "/nonexistent.pem"})[0],
         "sinks[0].tls: TLS settings apply to rediss:// urls only"),
        (redis_sink("rediss://127.0.0.1", tls={"ca_file": "/nonexistent.pem"})[0],
         "sinks[0].tls.ca_file: cannot read /nonexistent.pem"),
        (redis_sink("redis://127.0.0.1", streams="x")[0], "sinks[0].streams: unknown key"),
    ]
    for sink, expected in cases:
        proc = run_config(workdir, base_config(db, [sink]))
        assert proc.returncode == 2, (sink, proc.stderr)
        assert expected in proc.stderr, proc.stderr
        assert "hunter2-pw" not in proc.stderr


def test_a_retried_event_holds_its_key_while_later_batches_are_pipelined_and_other_keys_flow(db, relays,
                                                                                              redis_server):
    """Issue 45: batches are pipelined into Redis (the next enters while the previous one's replies
    are outstanding). An event that fails with a retriable error (ERR: its stream has exhausted the
    last possible id) while later events of its key and of other keys are in flight: the key's later
    events never reach a stream before it; the other keys are not held. A second key has its failing
    event and a later one (another stream) in the same batch: one EXEC runs the second XADD though
    the first failed, so the sink must not put them in one transaction."""
    good, blocked = unique("good"), unique("blocked")
    key, key2 = unique("held"), unique("same-batch")
    with redis_server.client() as client:
        # XADD * to it now fails at run time with ERR (retried), until the test deletes it.
        client.xadd("outbox." + blocked, {"f": "v"}, id="18446744073709551615-18446744073709551615")
    relay = relays(base_config(db, redis_sink(redis_server.url), max_attempts=50,
                               backoff={"initial": "300ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")
    # 3,000 events in one transaction: full batches of 500, one after the other in the pipeline.
    # The held key's events are more than a batch apart, so each of them is in a batch of its own.
    held_at = {100: (good, key), 600: (blocked, key), 1150: (good, key), 1700: (good, key), 2600: (good, key),
               2000: (blocked, key2), 2001: (good, key2), 2300: (good, key2)}
    rows = [(held_at[i][0], held_at[i][1], {"n": i}) if i in held_at else (good, f"other-{i % 50}", {"n": i})
            for i in range(3000)]
    ids = db.insert(rows)
    held_ids = [ids[i] for i in sorted(held_at) if held_at[i][1] == key]
    held2_ids = [ids[i] for i in sorted(held_at) if held_at[i][1] == key2]
    other_ids = [oid for i, oid in enumerate(ids) if i not in held_at]

    def others_done():
        return db.scalar("SELECT count(*) FROM outbox_events WHERE id = ANY(%s) AND processed_at IS NOT NULL",
                         (other_ids,)) == len(other_ids)
    wait_until(others_done, timeout=60, message="every event of the other keys delivered")
    state = {r[0]: r[1:] for r in db.query(
        "SELECT id, processed_at IS NOT NULL, attempts FROM outbox_events WHERE id = ANY(%s)",
        (held_ids + held2_ids,))}
    assert state[held_ids[0]][0], "the held key's event before the failure is delivered"
    for failing in (held_ids[1], held2_ids[0]):
        assert not state[failing][0] and state[failing][1] >= 1, "the failing event is being retried"
    for oid in held_ids[2:] + held2_ids[1:]:
        assert not state[oid][0], f"event {oid} of a held key was delivered while an earlier one is retried"
    assert db.scalar("SELECT max(attempts) FROM outbox_events WHERE id = ANY(%s)", (other_ids,)) == 0, \
        "the other keys were delivered at their first attempt"

    with redis_server.client() as client:
        client.delete("outbox." + blocked)  # the retries now go in, then the held events follow
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    with redis_server.client() as client:
        good_entries = read_stream(client, "outbox." + good)
        blocked_entries = read_stream(client, "outbox." + blocked)
    assert sorted(e.outbox_id for e in blocked_entries) == sorted([held_ids[1], held2_ids[0]])
    result = check_order(good_entries)
    assert result["duplicates"] == 0 and result["ids"] == set(ids) - {held_ids[1], held2_ids[0]}
    assert [e.outbox_id for e in good_entries if e.key == key] == [held_ids[0]] + held_ids[2:]
    assert [e.outbox_id for e in good_entries if e.key == key2] == held2_ids[1:]

    def entry_time(e):
        ms, seq = e.entry_id.split("-")
        return int(ms), int(seq)
    retried_at = {e.key: entry_time(e)[0] for e in blocked_entries}
    for e in good_entries:
        if e.key == key and e.outbox_id > held_ids[1] or e.key == key2:
            assert entry_time(e)[0] >= retried_at[e.key], f"event {e.outbox_id} reached Redis before the retried event"
    assert_no_dead_letters(db)
    assert relay.alive()
