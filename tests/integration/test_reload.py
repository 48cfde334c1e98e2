"""Issue 46, part 2: reload without a restart. SIGHUP (or `outbox-relay reload`, a NOTIFY on the
channel) re-reads the config file: routes, sinks, batch_size, polling and the log level change; a
sink whose entry did not change keeps its object and sees every event exactly once, in order per
key; an invalid file changes nothing; keys that need a restart keep their values, with a warning."""
from __future__ import annotations

import signal
import time

from conftest import (Writers, base_config, free_port, http_get, metric, read_jsonl, run_cli, unique, wait_until,
                      yaml_config)

RELOADS_OK = 'outbox_relay_config_reloads_total{result="ok"}'
RELOADS_ERROR = 'outbox_relay_config_reloads_total{result="error"}'


def ids_in(path):
    return [line["id"] for line in read_jsonl(path)]


def assert_once_in_key_order(lines, expected_ids):
    ids = [line["id"] for line in lines]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"
    assert set(ids) == set(expected_ids), f"missing {sorted(set(expected_ids) - set(ids))[:10]}"
    last = {}
    for line in lines:
        assert last.get(line["key"], 0) < line["id"], f"key {line['key']}: id {line['id']} after {last[line['key']]}"
        last[line["key"]] = line["id"]


def insert(db, topic, n, keys=10):
    return db.insert((topic, f"k{i % keys}", {"n": i}) for i in range(n))


def start(db, relays, workdir, port, sinks, routes=None, **relay):
    config = base_config(db, sinks, **relay)
    config["http"] = {"listen": f"127.0.0.1:{port}"}
    if routes is not None:
        config["routes"] = routes
    r = relays(config)
    r.wait_log("^listening$")  # the LISTEN session, not "http server listening"
    return r, config


def rewrite(relay, config):
    relay.config_path.write_text(yaml_config(config))


def metrics(port):
    return http_get(port, "/metrics")[1]


def reloaded_lines(relay):
    return [l for l in relay.logs() if l.get("msg") == "config reloaded"]


def test_sighup_changes_sinks_routes_batch_size_and_log_level(db, relays, workdir):
    port = free_port()
    audit, old, extra = workdir / "audit.jsonl", workdir / "old.jsonl", workdir / "extra.jsonl"
    sinks = [{"name": "audit", "type": "file", "path": str(audit)}, {"name": "old", "type": "file", "path": str(old)}]
    relay, config = start(db, relays, workdir, port, sinks)
    assert metric(metrics(port), RELOADS_OK) == 0 and metric(metrics(port), RELOADS_ERROR) == 0
    topic = unique("order")
    before = insert(db, topic, 60)
    wait_until(lambda: len(ids_in(audit)) == 60 and len(ids_in(old)) == 60)

    config["sinks"] = [sinks[0], {"name": "extra", "type": "file", "path": str(extra)}]
    config["routes"] = [{"topics": ["*"], "sinks": ["audit"]}, {"topics": ["order-*"], "sinks": ["extra"]}]
    config["relay"]["batch_size"] = 7
    config["log"] = {"level": "warn"}
    rewrite(relay, config)
    relay.proc.send_signal(signal.SIGHUP)
    line = relay.wait_log("^config reloaded$")
    assert line["sinks_added"] == ["extra"] and line["sinks_removed"] == ["old"]
    assert line["sinks_kept"] == ["audit"] and line["sinks_rebuilt"] == []
    assert "relay.batch_size" in line["changed"] and "log.level" in line["changed"] and "routes" in line["changed"]
    assert line["batch_size"] == 7 and line["log_level"] == "warn"
    assert 'sink="extra"' in metrics(port)  # its series, created at 0

    after = insert(db, topic, 60)
    wait_until(lambda: len(ids_in(audit)) >= 120 and len(ids_in(extra)) >= 60)
    time.sleep(0.5)  # anything more would be a duplicate
    assert_once_in_key_order(read_jsonl(audit), before + after)
    assert_once_in_key_order(read_jsonl(extra), after)
    assert sorted(ids_in(old)) == before  # flushed and gone at the reload
    text = metrics(port)
    assert metric(text, RELOADS_OK) == 1 and metric(text, RELOADS_ERROR) == 0
    assert metric(text, 'outbox_relay_events_published_total{sink="extra"}') == 60
    assert relay.alive()
    assert relay.stop() == 0
    # The new log level: no info line after the reload's own ("stop signal received", "stopped").
    msgs = [l["msg"] for l in relay.logs()]
    assert "stopped" not in msgs and msgs[-1] == "config reloaded", msgs[-3:]


def test_an_invalid_config_changes_nothing_and_is_counted(db, relays, workdir):
    port = free_port()
    audit, extra = workdir / "audit.jsonl", workdir / "extra.jsonl"
    sinks = [{"name": "audit", "type": "file", "path": str(audit)}]
    relay, config = start(db, relays, workdir, port, sinks)
    good_text = relay.config_path.read_text()
    topic = unique("order")

    # relay.batch_size: -1 is on line 5 of this file; an unknown sink type on line 14.
    bad = (f"database:\n  url: {db.url}\nrelay:\n  poll_interval: 5ms\n  batch_size: -1\n"
           f"http:\n  listen: 127.0.0.1:{port}\nsinks:\n  - name: audit\n    type: file\n    path: {audit}\n"
           f"  - name: extra\n    path: {extra}\n    type: carrier-pigeon\n")
    relay.config_path.write_text(bad)
    relay.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: metric(metrics(port), RELOADS_ERROR) == 1)
    errors = [l["error"] for l in relay.logs() if l.get("msg") == "config reload refused, nothing changed"]
    assert any(e.startswith("line 5: relay.batch_size") for e in errors), errors
    assert any(e.startswith("line 14: sinks[1].type") for e in errors), errors
    assert metric(metrics(port), RELOADS_OK) == 0
    assert not reloaded_lines(relay)

    ids = insert(db, topic, 40)  # still flowing to the old sink, with the old settings
    wait_until(lambda: len(ids_in(audit)) >= 40)
    assert_once_in_key_order(read_jsonl(audit), ids)
    assert not extra.exists()

    relay.config_path.write_text(good_text)  # fixed: the next reload applies (and changes nothing)
    relay.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: metric(metrics(port), RELOADS_OK) == 1)
    assert relay.stop() == 0


def test_outbox_relay_reload_notifies_the_running_relay(db, relays, workdir):
    port = free_port()
    audit, extra = workdir / "audit.jsonl", workdir / "extra.jsonl"
    sinks = [{"name": "audit", "type": "file", "path": str(audit)}]
    relay, config = start(db, relays, workdir, port, sinks)
    config["sinks"] = sinks + [{"name": "extra", "type": "file", "path": str(extra)}]
    rewrite(relay, config)
    proc = run_cli("--config", str(relay.config_path), "reload")
    assert "reload requested" in proc.stdout
    relay.wait_log("^config reloaded$")
    assert reloaded_lines(relay)[0]["sinks_added"] == ["extra"]
    ids = insert(db, unique("order"), 20)
    wait_until(lambda: len(ids_in(extra)) >= 20 and len(ids_in(audit)) >= 20)
    assert_once_in_key_order(read_jsonl(audit), ids)
    assert_once_in_key_order(read_jsonl(extra), ids)
    assert metric(metrics(port), RELOADS_OK) == 1
    assert relay.stop() == 0


def test_keys_that_need_a_restart_are_named_and_keep_their_values(db, relays, workdir):
    port, other_port = free_port(), free_port()
    audit = workdir / "audit.jsonl"
    relay, config = start(db, relays, workdir, port, [{"name": "audit", "type": "file", "path": str(audit)}])
    config["database"]["url"] = db.url.replace("/" + db.name, "/postgres")
    config["http"]["listen"] = f"127.0.0.1:{other_port}"
    config["relay"]["instance_id"] = "renamed"
    config["relay"]["batch_size"] = 3
    rewrite(relay, config)
    relay.proc.send_signal(signal.SIGHUP)
    line = relay.wait_log("^config reloaded$")
    warned = {l["key"] for l in relay.logs() if l.get("level") == "warn" and "restart is needed" in l.get("msg", "")}
    assert warned == {"database.url", "http.listen", "relay.instance_id"}
    assert line["restart_needed"] == ["database.url", "http.listen", "relay.instance_id"]
    assert line["batch_size"] == 3  # the rest applied
    assert metric(metrics(port), RELOADS_OK) == 1  # still on the old address
    assert http_get(other_port, "/metrics")[0] == 0
    ids = insert(db, unique("order"), 20)  # still on the old database
    wait_until(lambda: len(ids_in(audit)) >= 20)
    assert_once_in_key_order(read_jsonl(audit), ids)
    assert relay.stop() == 0


def test_reloads_during_a_steady_stream_lose_and_duplicate_nothing(db, relays, workdir):
    port = free_port()
    audit, side = workdir / "audit.jsonl", workdir / "side.jsonl"
    relay, config = start(db, relays, workdir, port, [{"name": "audit", "type": "file", "path": str(audit)}],
                          batch_size=50)
    writers = Writers(db, count=4, per_writer=1500, keys=100, batch=10, pause=0.01).start()
    for i in range(6):
        time.sleep(0.4)
        config["relay"]["batch_size"] = [7, 200, 31, 500, 1, 64][i]
        config["log"] = {"level": ["debug", "info"][i % 2]}
        # Every other reload adds or removes a second sink beside the unchanged one.
        config["sinks"] = config["sinks"][:1] + ([{"name": "side", "type": "file", "path": str(side)}] if i % 2 == 0
                                                 else [])
        rewrite(relay, config)
        relay.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(reloaded_lines(relay)) == i + 1, message=f"reload {i + 1}")
    writers.join()
    ids = [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert len(ids) == 6000
    wait_until(lambda: len(ids_in(audit)) >= 6000, timeout=60)
    time.sleep(0.5)
    assert_once_in_key_order(read_jsonl(audit), ids)
    side_ids = ids_in(side)
    assert len(side_ids) == len(set(side_ids))  # added and removed three times: never twice
    assert metric(metrics(port), RELOADS_OK) == 6
    assert relay.stop() == 0


def test_a_changed_sink_is_rebuilt_and_takes_the_events_from_the_reload_on(db, relays, workdir):
    port = free_port()
    first, second = workdir / "first.jsonl", workdir / "second.jsonl"
    sink = {"name": "audit", "type": "file", "path": str(first)}
    relay, config = start(db, relays, workdir, port, [sink])
    topic = unique("order")
    before = insert(db, topic, 30)
    wait_until(lambda: len(ids_in(first)) == 30)
    config["sinks"] = [{**sink, "path": str(second)}]  # the same name, another entry: a new sink
    rewrite(relay, config)
    relay.proc.send_signal(signal.SIGHUP)
    line = relay.wait_log("^config reloaded$")
    assert line["sinks_rebuilt"] == ["audit"] and line["sinks_kept"] == [] and line["sinks_added"] == []
    after = insert(db, topic, 30)
    wait_until(lambda: len(ids_in(second)) >= 30)
    time.sleep(0.3)
    assert_once_in_key_order(read_jsonl(first), before)
    assert_once_in_key_order(read_jsonl(second), after)
    assert metric(metrics(port), 'outbox_relay_events_published_total{sink="audit"}') == 60  # one series
    assert relay.stop() == 0
