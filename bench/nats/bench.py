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
from nats.js.api import StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sink_drains import file_drain, seed, timed_drain  # noqa: E402

def log(msg):
    print(f"[bench-nats {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)

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

    def drains(self):
        rounds = []
        for i in range(self.a.rounds):
            order = ["file", "nats"] if i % 2 == 0 else ["nats", "file"]
            rnd = {"round": i + 1, "order": order}
            for system in order:
                log(f"round {i + 1}: {system} drain of {self.a.events} events")
                seed(self.a.url, self.a.events)
                load_before = round(os.getloadavg()[0], 2)
                log_path = self.logs / f"relay-drain-{system}-{i + 1}.log"
                if system == "file":
                    r = file_drain(self.a.url, self.a.relay_bin, self.work, self.a.events, self.a.batch_size,
                                   log_path, self.a.relay_log_level)
                else:
                    stream = f"BENCH{i + 1}"
                    self.add_stream(stream, [f"bench.{i + 1}.>"])
                    r = timed_drain(self.a.url, self.a.relay_bin, self.work, "nats",
                                    {"name": "nats", "type": "nats", "url": self.a.nats,
                                     "subject": f"bench.{i + 1}.{{topic}}", "max_in_flight": self.a.max_in_flight},
                                    self.a.events, self.a.batch_size, log_path, self.a.relay_log_level)
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
