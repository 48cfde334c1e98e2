#!/usr/bin/env python3
"""What the fuzzer's `late` violations came down to, in isolation: an event E committed while no
writer that could still commit a lower id is open waits for writers of its lane that began AFTER E
committed, whenever an id below E was rolled back (in any lane). The design says an open writer
holds back the later events of its lanes, not earlier ones.

    ~/.cache/outbox-relay/venv/bin/python tests/fuzz/repro_later_writer.py --relay-bin PATH

Scenario 1 (one later writer): H1 writes K and stays open; a transaction writes a row (of K, or of
another lane) and rolls back; E (K) commits; H2 writes K (begun after E's commit) and stays open;
H1 commits (the last writer open at E's commit ends); H2 commits 4 s later. Run once without the
rollback (E goes out at H1's end) and once with it.
Scenario 2 (a chain): a rollback, E commits with no writer open, then writers of K, each open 1 s,
one every 0.5 s, for 10 s. E goes out when the chain ends."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from harness import Cluster, RelaySlot, Tailer, make_workdir, mono, remove_workdir, run_cli  # noqa: E402

INSERT = "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', %s, %s) RETURNING id"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--relay-bin", default="/tmp/relay-new/outbox-relay")
    args = p.parse_args()
    wd = make_workdir()
    cl = Cluster(wd)
    relay = tailer = None
    try:
        cl.start()
        with psycopg.connect(cl.url, autocommit=True) as c:
            c.execute("CREATE DATABASE m")
        url = cl.url_for("m")
        run_cli(args.relay_bin, "migrate", env={"DATABASE_URL": url})
        tailer = Tailer().start()
        relay = RelaySlot(0, args.relay_bin, url, wd, tailer).start()
        deadline = mono() + 30
        while tailer.log_seen(0, 1, "ordering lanes rebalanced") is None and mono() < deadline:
            time.sleep(0.05)
        ac = psycopg.connect(url, autocommit=True)
        lanes = ac.execute("SELECT hashtext('K') & 63, hashtext('Z-other') & 63").fetchone()

        def seen(event_id, wait=1.0):
            time.sleep(wait)
            lines, _ = tailer.snapshot()
            return next((ln.hi for ln in lines if ln.rec["id"] == event_id), None)

        print(f"lane of K {lanes[0]}, of Z-other {lanes[1]}")
        for gap_key in (None, "K", "Z-other"):
            h1, h2 = psycopg.connect(url), psycopg.connect(url)
            h1.execute(INSERT, ("K", json.dumps({"w": "h1"})))
            if gap_key:
                rb = psycopg.connect(url)
                rb.execute(INSERT, (gap_key, "{}"))
                rb.rollback()
                rb.close()
            e = ac.execute(INSERT, ("K", json.dumps({"w": "E"}))).fetchone()[0]
            time.sleep(0.3)
            h2.execute(INSERT, ("K", json.dumps({"w": "h2"})))     # begun after E committed
            time.sleep(0.3)
            h1.commit()
            t_h1 = mono()
            time.sleep(4.0)
            h2.commit()
            t_h2 = mono()
            t = seen(e)
            h1.close()
            h2.close()
            print(f"scenario 1, rolled-back row {'of ' + gap_key if gap_key else 'none'}: E (id {e}) delivered "
                  f"{'never' if t is None else f'{t - t_h1:+.2f} s'} after the last writer open at its commit ended; "
                  f"the later writer H2 ended {t_h2 - t_h1:+.2f} s after it")
        rb = psycopg.connect(url)
        rb.execute(INSERT, ("Z-other", "{}"))
        rb.rollback()
        rb.close()
        e = ac.execute(INSERT, ("K", json.dumps({"w": "E2"}))).fetchone()[0]
        t_e = mono()
        chain = []
        for n in range(20):
            c = psycopg.connect(url)
            c.execute(INSERT, ("K", json.dumps({"n": n})))
            chain.append((mono(), c))
            time.sleep(0.5)
            while chain and mono() - chain[0][0] >= 1.0:
                old = chain.pop(0)[1]
                old.commit()
                old.close()
        for _, c in chain:
            c.commit()
            c.close()
        t_end = mono()
        t = seen(e)
        print(f"scenario 2: E (id {e}) committed with no writer open, delivered "
              f"{'never' if t is None else f'{t - t_e:.2f} s'} later; the chain of later writers of its lane "
              f"ended {t_end - t_e:.2f} s after E's commit")
        ac.close()
    finally:
        if relay:
            relay.terminate()
        if tailer:
            tailer.stop()
        cl.stop()
        remove_workdir(wd)


if __name__ == "__main__":
    main()
