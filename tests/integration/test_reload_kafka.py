"""Issue 46, part 2, acceptance: reloads during a stream of ~1,000 events/s over 100 keys with a
Kafka sink and a file sink that keep their entries: 5 reloads that change routes, batch_size and
the log level, one invalid reload in the middle. 0 lost, per-key order, 0 duplicates at both."""
from __future__ import annotations

import signal
import time

from conftest import (Writers, assert_no_dead_letters, base_config, free_port, http_get, metric, read_jsonl, unique,
                      wait_until, yaml_config)
from kafka_fixtures import check_order, kafka_broker, read_topic  # noqa: F401


def test_five_reloads_and_an_invalid_one_during_a_stream_cost_no_event_and_no_duplicate(db, relays, workdir,
                                                                                         kafka_broker):
    row_topic = unique("order")
    kafka_topic = "outbox." + row_topic
    kafka_broker.create_topic(kafka_topic, partitions=6)
    port = free_port()
    audit, side = workdir / "audit.jsonl", workdir / "side.jsonl"
    kafka = {"name": "kafka", "type": "kafka", "brokers": kafka_broker.bootstrap, "topic": "outbox.{topic}"}
    audit_sink = {"name": "audit", "type": "file", "path": str(audit)}
    side_sink = {"name": "side", "type": "file", "path": str(side)}
    config = base_config(db, [kafka, audit_sink], batch_size=100)
    config["http"] = {"listen": f"127.0.0.1:{port}"}
    relay = relays(config)
    relay.wait_log("^listening$")

    # Five valid reloads (routes, batch_size, log level, a sink beside the two that stay), and an
    # invalid one third.
    changes = [
        {"batch_size": 7, "level": "debug", "routes": [{"topics": ["*"], "sinks": ["kafka", "audit", "side"]}]},
        {"batch_size": 500, "level": "info", "routes": [{"topics": ["order-*"], "sinks": ["kafka", "audit"]},
                                                        {"topics": ["*"], "sinks": ["side"]}]},
        None,
        {"batch_size": 1, "level": "warn", "routes": None},
        {"batch_size": 64, "level": "info", "routes": [{"topics": ["*"], "sinks": ["audit", "kafka"]}]},
        {"batch_size": 250, "level": "debug", "routes": None},
    ]
    writers = Writers(db, count=5, per_writer=1600, keys=100, topic=row_topic, batch=5, pause=0.02).start()
    started = time.monotonic()
    for i, change in enumerate(changes):
        time.sleep(1.0)
        if change is None:
            relay.config_path.write_text(relay.config_path.read_text().replace('"batch_size": ', '"batch_size": -'))
        else:
            config["relay"]["batch_size"] = change["batch_size"]
            config["log"] = {"level": change["level"]}
            config["sinks"] = [kafka, audit_sink] + ([side_sink] if change["routes"] and i < 2 else [])
            config.pop("routes", None)
            if change["routes"]:
                config["routes"] = [{"topics": r["topics"], "sinks": [s for s in r["sinks"]
                                                                      if s in {x["name"] for x in config["sinks"]}]}
                                    for r in change["routes"]]
            relay.config_path.write_text(yaml_config(config))
        relay.proc.send_signal(signal.SIGHUP)
        expected = (sum(1 for c in changes[:i + 1] if c is not None), sum(1 for c in changes[:i + 1] if c is None))
        wait_until(lambda: (metric(http_get(port, "/metrics")[1], 'outbox_relay_config_reloads_total{result="ok"}'),
                            metric(http_get(port, "/metrics")[1], 'outbox_relay_config_reloads_total{result="error"}'))
                   == expected, message=f"reload {i + 1} counted")
    writers.join()
    rate = 8000 / (time.monotonic() - started)
    ids = [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert len(ids) == 8000
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0, timeout=120)
    assert_no_dead_letters(db)

    messages = read_topic(kafka_broker.bootstrap, kafka_topic)
    result = check_order(messages)
    assert result["duplicates"] == 0 and result["ids"] == set(ids), f"{len(messages)} messages"
    lines = read_jsonl(audit)
    assert len(lines) == 8000 and {l["id"] for l in lines} == set(ids), "audit: each event once"
    last = {}
    for line in lines:
        assert last.get(line["key"], 0) < line["id"]
        last[line["key"]] = line["id"]
    side_ids = [l["id"] for l in read_jsonl(side)]
    assert len(side_ids) == len(set(side_ids))

    reloaded = [l for l in relay.logs() if l.get("msg") == "config reloaded"]
    assert len(reloaded) >= 4  # the one to warn is not logged at warn
    assert all(l["sinks_kept"][:2] == ["kafka", "audit"] for l in reloaded)
    refused = [l["error"] for l in relay.logs() if l.get("msg") == "config reload refused, nothing changed"]
    assert len(refused) == 1 and "relay.batch_size" in refused[0] and refused[0].startswith("line ")
    print(f"~{rate:.0f} events/s while reloading; {len(messages)} Kafka messages, {len(side_ids)} in side")
    assert relay.stop() == 0
