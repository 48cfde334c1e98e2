#!/usr/bin/env python3
"""The nats sink benchmark (issue 13), run by bench/nats/run.sh on one throwaway Postgres cluster
(fsync on) and one throwaway nats-server with JetStream (file storage), both on this machine.

Drain rounds (--events pending events each, default 200,000; --rounds rounds, default 2, each
system once per round, the order alternating):
  file  the real relay binary, file sink (fsync on)
  nats  the real relay binary, nats sink (async JetStream publishes, success on the PubAck), into
        a fresh stream per round
Events are the Kafka benchmark's: ~150 bytes of JSON, keys over 10,000 aggregates. A drain is
timed from starting the process until the last row is marked (a primary-key range probe every
2 ms), like bench/kafka/bench.py. A nats round is valid only if the stream then holds exactly
--events messages (no loss, no duplicate); a file round only if the file has --events lines.
Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import nats
import psycopg
from nats.js.api import StreamConfig

SEED_SQL = """
INSERT INTO outbox_events (topic, aggregate_id, payload)
SELECT 'order.paid', 'order-' || (g % 10000),
       jsonb_build_object('order_id', g, 'amount_cents', (g * 7919) % 100000, 'currency', 'EUR',
                          'customer', 'customer-' || (g % 977), 'paid_at', '2026-11-30T06:32:22Z',
                          'items', (g % 5) + 1)
FROM generate_series(1, {count}) AS g
"""


def log(msg):
    print(f"[bench-nats {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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

    async def _js(self, fn):
        nc = None
        deadline = time.monotonic() + 30
        while nc is None:
            try:
                nc = await nats.connect(self.a.nats, connect_timeout=2, allow_reconnect=False)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        try:
            return await fn(nc.jetstream())
        finally:
            await nc.close()

    def add_stream(self, name, subjects):
        asyncio.run(self._js(lambda js: js.add_stream(StreamConfig(name=name, subjects=subjects))))

    def stream_count(self, name):
        async def count(js):
            return (await js.stream_info(name)).state.messages
        return asyncio.run(self._js(count))

    def delete_stream(self, name):
        asyncio.run(self._js(lambda js: js.delete_stream(name)))

    def seed(self, count):
        self.sql("TRUNCATE outbox_events RESTART IDENTITY")
        self.sql(SEED_SQL.format(count=int(count)))
        self.sql("VACUUM ANALYZE outbox_events")
        self.sql("CHECKPOINT")

    def relay_drain(self, name, sink, rnd):
        cfg = {"database": {"url": self.a.url}, "relay": {"batch_size": self.a.batch_size},
               "http": {"enabled": False}, "log": {"level": self.a.relay_log_level}, "sinks": [sink]}
        path = self.work / f"drain-{name}.yaml"
        path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
        n = self.a.events
        max_id = self.sql("SELECT max(id) FROM outbox_events")[0][0]
        probe = ("SELECT count(*) FROM outbox_events WHERE id > %s AND processed_at IS NULL "
                 "AND dead_lettered_at IS NULL")
        with psycopg.connect(self.a.url, autocommit=True) as conn, \
                open(self.logs / f"relay-drain-{name}-{rnd}.log", "w") as log_file:
            t0 = time.monotonic()
            relay = subprocess.Popen([self.a.relay_bin, "run", "--config", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=log_file)
            deadline = t0 + 600
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
        out = {"events": n, "unprocessed_after": unprocessed, "relay_exit_code": code, "valid": ok}
        if ok:
            out["seconds"] = round(t_done - t0, 3)
            out["rate"] = round(n / (t_done - t0), 1)
        return out

    def drains(self):
        rounds = []
        for i in range(self.a.rounds):
            order = ["file", "nats"] if i % 2 == 0 else ["nats", "file"]
            rnd = {"round": i + 1, "order": order}
            for system in order:
                log(f"round {i + 1}: {system} drain of {self.a.events} events")
                self.seed(self.a.events)
                load_before = round(os.getloadavg()[0], 2)
                if system == "file":
                    sink_path = self.work / "drain-sink.jsonl"
                    sink_path.unlink(missing_ok=True)
                    r = self.relay_drain("file", {"name": "file", "type": "file", "path": str(sink_path),
                                                  "fsync": True}, i + 1)
                    r["lines"] = sum(1 for _ in open(sink_path)) if sink_path.exists() else 0
                    r["valid"] = r["valid"] and r["lines"] == self.a.events
                    sink_path.unlink(missing_ok=True)
                else:
                    stream = f"BENCH{i + 1}"
                    self.add_stream(stream, [f"bench.{i + 1}.>"])
                    r = self.relay_drain("nats", {"name": "nats", "type": "nats", "url": self.a.nats,
                                                  "subject": f"bench.{i + 1}.{{topic}}",
                                                  "max_in_flight": self.a.max_in_flight}, i + 1)
                    r["in_stream"] = self.stream_count(stream)
                    r["valid"] = r["valid"] and r["in_stream"] == self.a.events
                    self.delete_stream(stream)
                r["loadavg_1m"] = [load_before, round(os.getloadavg()[0], 2)]
                rnd[system] = r
                log(f"  {r.get('rate', 0):,.0f}/s valid={r['valid']} (load average {r['loadavg_1m']})")
            rounds.append(rnd)
        return rounds

    def run(self):
        subprocess.run([self.a.relay_bin, "migrate"], env={**os.environ, "DATABASE_URL": self.a.url}, check=True,
                       capture_output=True, timeout=120)
        result = {"meta": {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                           "nproc": os.cpu_count(),
                           "git": subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short",
                                                  "HEAD"], capture_output=True, text=True).stdout.strip(),
                           "nats_server": subprocess.run(["nats-server", "--version"], capture_output=True,
                                                         text=True).stdout.strip()},
                  "config": {k: v for k, v in vars(self.a).items() if k != "url"}}
        result["drain_rounds"] = self.drains()
        summary = {}
        for system in ("file", "nats"):
            rates = [r[system]["rate"] for r in result["drain_rounds"] if r[system].get("valid")]
            summary[system] = {"median_rate": round(statistics.median(rates), 1) if rates else None, "rates": rates}
        f, n = summary["file"]["median_rate"], summary["nats"]["median_rate"]
        summary["nats_over_file"] = round(n / f, 3) if f and n else None
        summary["nats_over_file_per_round"] = [round(r["nats"]["rate"] / r["file"]["rate"], 3)
                                               for r in result["drain_rounds"]
                                               if r["nats"].get("valid") and r["file"].get("valid")]
        result["drain_summary"] = summary
        return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--nats", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--max-in-flight", type=int, default=1024)
    p.add_argument("--relay-log-level", default="info")
    a = p.parse_args()
    result = Bench(a).run()
    Path(a.out).write_text(json.dumps(result, indent=2))
    s = result["drain_summary"]
    print(f"\ndrain of {a.events:,} events, {a.rounds} rounds (events/s, median; per round)")
    print(f"| sink | median | rounds |")
    print(f"| --- | ---: | --- |")
    for system in ("file", "nats"):
        print(f"| {system} | {s[system]['median_rate'] or 0:,.0f} | {', '.join(f'{r:,.0f}' for r in s[system]['rates'])} |")
    print(f"nats / file: {s['nats_over_file']} (per round {s['nats_over_file_per_round']})")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
