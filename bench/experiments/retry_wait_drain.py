"""A drain while an event waits for its retry: the head-of-line look of every claim, old beside new.

    ~/.cache/outbox-relay/venv/bin/python bench/experiments/retry_wait_drain.py \
        --relay-bin-old OLD/outbox-relay --relay-bin NEW/outbox-relay [--events 100000] [--rounds 3] \
        [--relay-first]

While any event has failed and waits for its retry, every claim and poll looks, for each event it
chooses, for an earlier failed event of the same key (schema 7's head-of-line rule): through the
retry index, which schema 13 moved from (aggregate_id, id) to (hash of aggregate_id, id). This
drains N pending events over 500 keys, one of whose first events failed and waits an hour (its
attempts and next_attempt_at set by hand: the sink's failure is not what is measured), so that the
look runs for the whole drain; the key's later events stay pending. Two databases of one
throwaway cluster, each migrated by its own binary, drained alternately, each round from a
truncated table. File sink without fsync, batch_size 500. Prints each drain's events/s.

--relay-first: the relay starts on the empty table (truncated, VACUUM ANALYZE: its plans are made
there, as a relay started on a new table makes them), and the backlog with its waiting retry is
committed 3 s later, in one transaction; the drain is timed from that commit. Schema 13's plan
then read the pending index for the head-of-line look (23 s against 1.3 s; schema 14 fixed it)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from conftest import Database, throwaway_cluster, yaml_config  # noqa: E402

KEYS = 500


def seed(conn, events: int) -> None:
    """The backlog, and key k0's first event failed and waiting an hour, in one transaction."""
    with conn.transaction():
        conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                     "SELECT 'order.paid', 'k' || (g %% %s), jsonb_build_object('n', g, 'pad', repeat('x', 100)) "
                     "FROM generate_series(1, %s) AS g" % (KEYS, events))
        conn.execute("UPDATE outbox_events SET attempts = 1, next_attempt_at = now() + interval '1 hour', "
                     "last_error = 'experiment' WHERE id = %s", (KEYS,))


def drain(db: Database, relay_bin: str, events: int, work: Path, relay_first=False) -> tuple[float, int]:
    """Seconds to drain every event but the waiting key's, and how many were delivered."""
    with db.connect() as conn:
        conn.execute("TRUNCATE outbox_events RESTART IDENTITY")
        if not relay_first:
            seed(conn, events)
        conn.execute("VACUUM ANALYZE outbox_events")
    out = work / f"{db.name}.jsonl"
    out.unlink(missing_ok=True)
    config = {"database": {"url": db.url}, "relay": {"batch_size": 500}, "http": {"enabled": False},
              "sinks": [{"name": "f", "type": "file", "path": str(out), "fsync": False}]}
    (work / "config.yaml").write_text(yaml_config(config))
    started = time.monotonic()
    relay = subprocess.Popen([relay_bin, "run", "--config", str(work / "config.yaml")],
                             stdout=subprocess.DEVNULL, stderr=(work / f"{db.name}.log").open("w"))
    try:
        if relay_first:
            time.sleep(3)  # its start-up claim on the empty table
            with db.connect() as conn:
                seed(conn, events)
            started = time.monotonic()
        with db.connect() as conn:
            while time.monotonic() - started < 300:
                if not conn.execute("SELECT EXISTS (SELECT 1 FROM outbox_events WHERE processed_at IS NULL "
                                    "AND aggregate_id <> 'k0')").fetchone()[0]:
                    break
                time.sleep(0.05)
        took = time.monotonic() - started
    finally:
        relay.terminate()
        relay.wait(30)
    return took, sum(1 for _ in out.open())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--relay-bin-old", required=True)
    ap.add_argument("--relay-bin", required=True)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--relay-first", action="store_true",
                    help="start the relay on the empty table, then commit the backlog (its plans made on the empty table)")
    a = ap.parse_args()
    bins = {"old": a.relay_bin_old, "new": a.relay_bin}
    with throwaway_cluster("retry-wait-") as cluster:
        dbs = {}
        for name, relay_bin in bins.items():
            with psycopg.connect(cluster.url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            dbs[name] = Database(cluster, name)
            subprocess.run([relay_bin, "migrate"], env={**os.environ, "DATABASE_URL": dbs[name].url}, check=True,
                           capture_output=True)
        work = Path(tempfile.mkdtemp(prefix="retry-wait-"))
        held = a.events // KEYS
        for r in range(a.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for name in order:
                took, lines = drain(dbs[name], bins[name], a.events, work, a.relay_first)
                print(f"round {r + 1} {name}: {a.events - held} events in {took:.3f} s, "
                      f"{(a.events - held) / took:,.0f} events/s ({lines} delivered)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
