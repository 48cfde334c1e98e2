#!/usr/bin/env python3
"""The RabbitMQ sink benchmark (issue 13), run by bench/rabbitmq/run.sh on one throwaway Postgres
cluster (fsync on) and one throwaway RabbitMQ node, both on this machine.

Each round drains --events pending events (default 200,000, keys over 10,000 aggregates,
~150-byte payloads) with the real relay binary, once to the file sink (fsync on) and once to the
rabbitmq sink (publisher confirms, persistent messages, one durable classic queue bound to a
topic exchange); the order alternates between rounds (ABBA). A drain is timed from starting the
process until the last row is marked (a primary-key range probe every 2 ms), like
bench/kafka/bench.py. After each RabbitMQ drain the queue must hold exactly --events messages.
Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from rabbitmq_fixtures import RabbitServer  # noqa: E402

SEED_SQL = """
INSERT INTO outbox_events (topic, aggregate_id, payload)
SELECT 'order.paid', 'order-' || (g % 10000),
       jsonb_build_object('order_id', g, 'amount_cents', (g * 7919) % 100000, 'currency', 'EUR',
                          'customer', 'customer-' || (g % 977), 'paid_at', '2026-11-30T06:32:22Z',
                          'items', (g % 5) + 1)
FROM generate_series(1, {count}) AS g
"""


def log(msg):
    print(f"[bench-rabbitmq {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)

    def sql(self, statement, params=None):
        with psycopg.connect(self.a.url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else None

    def seed(self):
        self.sql("TRUNCATE outbox_events RESTART IDENTITY")
        self.sql(SEED_SQL.format(count=int(self.a.events)))
        self.sql("VACUUM ANALYZE outbox_events")
        self.sql("CHECKPOINT")

    def drain(self, name, sink, rnd):
        cfg = {"database": {"url": self.a.url}, "relay": {"batch_size": self.a.batch_size},
               "http": {"enabled": False}, "log": {"level": "info"}, "sinks": [sink]}
        path = self.work / f"drain-{name}.yaml"
        path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
        max_id = self.sql("SELECT max(id) FROM outbox_events")[0][0]
        probe = ("SELECT count(*) FROM outbox_events WHERE id > %s AND processed_at IS NULL "
                 "AND dead_lettered_at IS NULL")
        with psycopg.connect(self.a.url, autocommit=True) as conn, \
                open(self.logs / f"relay-{name}-{rnd}.log", "w") as log_file:
            t0 = time.monotonic()
            relay = subprocess.Popen([self.a.relay_bin, "run", "--config", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=log_file)
            deadline = t0 + 900
            t_done = None
            while time.monotonic() < deadline and relay.poll() is None:
                if conn.execute(probe, (max_id - 1000,)).fetchone()[0] == 0:
                    t_done = time.monotonic()
                    break
                time.sleep(0.002)
            relay.terminate()
            code = relay.wait(timeout=30)
        unprocessed = self.sql("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")[0][0]
        ok = t_done is not None and unprocessed == 0 and code == 0
        out = {"events": self.a.events, "unprocessed_after": unprocessed, "relay_exit_code": code, "valid": ok}
        if ok:
            out["seconds"] = round(t_done - t0, 3)
            out["rate"] = round(self.a.events / (t_done - t0), 1)
        return out

    def run(self):
        server = RabbitServer(Path(tempfile.mkdtemp(prefix="node-", dir=self.work)))
        log(f"starting RabbitMQ on 127.0.0.1:{server.port}")
        server.start()
        results = {"file": [], "rabbitmq": []}
        try:
            server.declare("bench", "bench-orders", "order.#")
            rabbit = {"name": "rabbitmq", "type": "rabbitmq", "url": server.url, "exchange": "bench",
                      "max_in_flight": self.a.max_in_flight}
            for rnd in range(self.a.rounds):
                order = ["file", "rabbitmq"] if rnd % 2 == 0 else ["rabbitmq", "file"]
                for name in order:
                    self.seed()
                    if name == "file":
                        target = self.work / f"events-{rnd}.jsonl"
                        r = self.drain(name, {"name": "file", "type": "file", "path": str(target), "fsync": True}, rnd)
                        target.unlink(missing_ok=True)
                    else:
                        r = self.drain(name, rabbit, rnd)
                        conn = server.connection()
                        ch = conn.channel()
                        r["in_queue"] = ch.queue_declare("bench-orders", durable=True, passive=True).method.message_count
                        ch.queue_purge("bench-orders")
                        conn.close()
                        r["valid"] = r["valid"] and r["in_queue"] == self.a.events
                    log(f"round {rnd + 1} {name}: {r.get('rate')} events/s ({r})")
                    results[name].append(r)
        finally:
            server.stop()
        return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--max-in-flight", type=int, default=1000)
    a = p.parse_args()
    results = Bench(a).run()
    summary = {}
    for name, rs in results.items():
        rates = [r["rate"] for r in rs if r.get("valid")]
        summary[name] = {"median_rate": statistics.median(rates) if rates else None, "rates": rates,
                         "valid_rounds": len(rates), "rounds": len(rs)}
    ratio = (summary["rabbitmq"]["median_rate"] / summary["file"]["median_rate"]
             if summary["rabbitmq"]["median_rate"] and summary["file"]["median_rate"] else None)
    doc = {"when": dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
           "events": a.events, "batch_size": a.batch_size, "max_in_flight": a.max_in_flight,
           "results": results, "summary": summary, "rabbitmq_over_file": ratio}
    Path(a.out).write_text(json.dumps(doc, indent=2))
    print(f"\n{'sink':<10} {'median events/s':>16}  per round")
    for name in ("file", "rabbitmq"):
        s = summary[name]
        print(f"{name:<10} {s['median_rate'] or 0:>16,.0f}  {', '.join(f'{r:,.0f}' for r in s['rates'])}")
    if ratio:
        print(f"rabbitmq / file: {ratio:.2f}")
    print(f"(written to {a.out})")


if __name__ == "__main__":
    main()
