"""What a claim of large events costs the relay in memory: an experiment, not a gate.

    ~/.cache/outbox-relay/venv/bin/python bench/experiments/claim_memory.py --events 30 --mb 20 \
        --relay-bin build-bench/bin/outbox-relay [--batch-size 500] [--pad x|json|noise]

A throwaway cluster (scripts/pg-cluster.sh) and database migrated by the binary; N pending events
of S MiB payload each (8 keys); one relay with a file sink (no fsync) drains them. Prints the
relay's peak resident memory (VmHWM) against the payload bytes: a claim holds every row it
returns, so the relay's memory grows with batch_size times the row size, not with
relay.in_flight_bytes (which bounds only what the sinks hold at once). Schema 12 bounds a claim by
relay.in_flight_bytes too. The pad: "x" repeated (pglz compresses it ~90 times), JSON records of
random words and numbers (~3-4 times), or random base64 (not at all)."""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from conftest import Database, throwaway_cluster, yaml_config  # noqa: E402


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return 0.0


WORDS = [f"{w}{n}" for w in ("order", "item", "sku", "price", "customer", "status", "note") for n in range(40)]


def pad(kind: str, size: int, seed: int):
    if kind == "x":
        return "x" * size
    if kind == "noise":
        return base64.b64encode(os.urandom(size * 3 // 4)).decode()
    rng = random.Random(seed)
    records, length = [], 0
    while length < size:
        r = {"id": rng.randrange(10**9), "name": " ".join(rng.choices(WORDS, k=4)), "qty": rng.randrange(100),
             "price": round(rng.random() * 1000, 2), "tags": rng.choices(WORDS, k=3)}
        records.append(r)
        length += len(json.dumps(r)) + 2
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30)
    ap.add_argument("--mb", type=float, default=20, help="payload size of each event, MiB")
    ap.add_argument("--pad", choices=["x", "json", "noise"], default="x")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--relay-bin", required=True)
    a = ap.parse_args()
    with throwaway_cluster("claim-memory-") as cluster:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE m")
        db = Database(cluster, "m")
        db.migrate()
        size = int(a.mb * (1 << 20))
        with db.connect() as conn:
            for i in range(a.events):
                conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', %s, %s)",
                             (f"k{i % 8}", json.dumps({"n": i, "pad": pad(a.pad, size, i)})))
        work = Path(tempfile.mkdtemp(prefix="claim-memory-"))
        config = {"database": {"url": db.url}, "relay": {"batch_size": a.batch_size}, "http": {"enabled": False},
                  "sinks": [{"name": "f", "type": "file", "path": str(work / "out.jsonl"), "fsync": False}]}
        (work / "config.yaml").write_text(yaml_config(config))
        started = time.monotonic()
        relay = subprocess.Popen([a.relay_bin, "run", "--config", str(work / "config.yaml")],
                                 stdout=subprocess.DEVNULL, stderr=(work / "relay.log").open("w"))
        peak, left = 0.0, a.events
        try:
            while time.monotonic() - started < 300 and left:
                peak = max(peak, peak_rss_mb(relay.pid))
                left = db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")
                time.sleep(0.2)
        finally:
            relay.terminate()
            relay.wait(30)
        print(f"{a.events} events of {a.mb} MiB ({a.pad}, batch_size {a.batch_size}): {a.events * a.mb:.0f} MiB of payload, "
              f"drained in {time.monotonic() - started:.1f} s ({left} left); relay peak RSS {peak:.0f} MiB "
              f"({peak / (a.events * a.mb):.2f}x the payload)")
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
