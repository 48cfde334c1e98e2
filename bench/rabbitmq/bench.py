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
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "bench"))
from rabbitmq_fixtures import RabbitServer  # noqa: E402
from sink_drains import file_drain, seed, timed_drain  # noqa: E402

def log(msg):
    print(f"[bench-rabbitmq {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)

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
                    seed(self.a.url, self.a.events)
                    log_path = self.logs / f"relay-{name}-{rnd}.log"
                    if name == "file":
                        r = file_drain(self.a.url, self.a.relay_bin, self.work, self.a.events, self.a.batch_size,
                                       log_path)
                    else:
                        r = timed_drain(self.a.url, self.a.relay_bin, self.work, name, rabbit, self.a.events,
                                        self.a.batch_size, log_path, timeout=900)
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
