#!/usr/bin/env python3
"""The Redis sink benchmark (issue 13), run by bench/redis/run.sh on one throwaway Postgres
cluster (fsync on) and one throwaway redis-server (appendonly yes, appendfsync always: an
acknowledged entry is on disk, as the file sink's are), both on this machine.

Drain rounds (200,000 pending events each, default 2 rounds, the order alternating):
  file   the real relay binary, file sink (fsync on)
  redis  the real relay binary, Redis sink (one MULTI/XADD.../EXEC round trip per batch)
Timed like bench/kafka/bench.py: from starting the relay process until the last row is marked
(a primary-key range probe every 2 ms). Each drain is checked: every row marked, and exactly
200,000 lines in the file / entries in the stream.

Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sink_drains import file_drain, seed, sql, timed_drain  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# ~150 bytes of JSON, keys over 10,000 aggregates: an order event (as bench/kafka/bench.py).
def log(msg):
    print(f"[bench-redis {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.redis = redis.Redis(host="127.0.0.1", port=a.redis_port, socket_timeout=60)

    def drain(self, system, rnd):
        seed(self.a.url, self.a.events)
        log_path = self.logs / f"relay-drain-{system}-{rnd}.log"
        if system == "file":
            return file_drain(self.a.url, self.a.relay_bin, self.work, self.a.events, self.a.batch_size, log_path)
        stream = f"bench.drain.{rnd}"
        r = timed_drain(self.a.url, self.a.relay_bin, self.work, "redis",
                        {"name": "redis", "type": "redis", "url": f"redis://127.0.0.1:{self.a.redis_port}",
                         "stream": stream}, self.a.events, self.a.batch_size, log_path)
        r["in_stream"] = self.redis.xlen(stream)
        r["valid"] = r["valid"] and r["in_stream"] == self.a.events
        self.redis.delete(stream)
        return r

    def run(self):
        subprocess.run([self.a.relay_bin, "migrate"], env={**os.environ, "DATABASE_URL": self.a.url}, check=True,
                       capture_output=True, timeout=120)
        result = {"meta": self.meta(), "config": {k: v for k, v in vars(self.a).items() if k != "url"}}
        rounds = []
        for i in range(self.a.rounds):
            order = ["file", "redis"] if i % 2 == 0 else ["redis", "file"]
            rnd = {"round": i + 1, "order": order}
            for system in order:
                log(f"round {i + 1}: {system} drain of {self.a.events} events")
                load_before = round(os.getloadavg()[0], 2)
                rnd[system] = self.drain(system, i + 1)
                rnd[system]["loadavg_1m"] = [load_before, round(os.getloadavg()[0], 2)]
                log(f"  {rnd[system].get('rate', 0):,.0f}/s valid={rnd[system]['valid']} "
                    f"(load average {rnd[system]['loadavg_1m']})")
            rounds.append(rnd)
        result["drain_rounds"] = rounds
        summary = {}
        for system in ("file", "redis"):
            rates = [r[system]["rate"] for r in rounds if r[system].get("valid")]
            summary[system] = {"median_rate": round(statistics.median(rates), 1) if rates else None, "rates": rates}
        summary["redis_over_file_per_round"] = [round(r["redis"]["rate"] / r["file"]["rate"], 3) for r in rounds
                                                if r["redis"].get("valid") and r["file"].get("valid")]
        result["drain_summary"] = summary
        result["meta"]["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return result

    def meta(self):
        def out(cmd):
            try:
                return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
            except OSError:
                return None
        return {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "git": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
                "git_dirty": bool(out(["git", "-C", str(ROOT), "status", "--porcelain", "--", "relay", "bench/redis"])),
                "nproc": os.cpu_count(),
                "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                            None),
                "postgres": sql(self.a.url, "SHOW server_version")[0][0],
                "redis": self.redis.info("server")["redis_version"],
                "redis_appendfsync": self.redis.config_get("appendfsync")["appendfsync"],
                "hiredis": out(["pkg-config", "--modversion", "hiredis"]),
                "relay": out([self.a.relay_bin, "--version"])}


def table(r):
    s = r["drain_summary"]
    lines = ["", "drain of %d pending events (median of %d rounds, events/s):" % (r["config"]["events"],
                                                                                 r["config"]["rounds"])]
    for system, label in (("file", "relay, file sink (fsync)"),
                          ("redis", "relay, Redis sink (AOF appendfsync always)")):
        lines.append(f"  {label:45s} {s[system]['median_rate'] or 0:>10,.0f}   rounds: {s[system]['rates']}")
    lines.append(f"  redis / file per round: {s['redis_over_file_per_round']}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--redis-port", type=int, required=True)
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    r = Bench(a).run()
    Path(a.out).write_text(json.dumps(r, indent=1, default=str))
    print(table(r))
    print(f"\nwritten: {a.out}")


if __name__ == "__main__":
    main()
