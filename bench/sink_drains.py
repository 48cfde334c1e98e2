"""What the sink benchmarks share (bench/{kafka,nats,rabbitmq,redis}/bench.py): the seeded backlog, and
a drain by the real relay binary, timed from starting the process until the last row is marked (a
primary-key range probe every 2 ms), to the sink under test or to the file sink (fsync on) as the
baseline of the same run; and the paced single-row writers of the latency runs (bench/kafka,
bench/sinks.py)."""
from __future__ import annotations

import json
import random
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import psycopg

from pgcost import free_port, process_cpu_seconds

# ~150-byte payloads, keys over 10,000 aggregates.
SEED_SQL = """
INSERT INTO outbox_events (topic, aggregate_id, payload)
SELECT 'order.paid', 'order-' || (g % 10000),
       jsonb_build_object('order_id', g, 'amount_cents', (g::bigint * 7919) % 100000, 'currency', 'EUR',
                          'customer', 'customer-' || (g % 977), 'paid_at', '2026-11-30T06:32:22Z',
                          'items', (g % 5) + 1)
FROM generate_series(1, {count}) AS g
"""


def pct(values, p):
    """The p-quantile (0..1) of values, interpolated between ranks; None when empty."""
    values = sorted(values)
    if not values:
        return None
    k = (len(values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def sql(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def seed(url, count):
    """count pending events in a truncated outbox_events, vacuumed, analyzed and checkpointed."""
    sql(url, "TRUNCATE outbox_events RESTART IDENTITY")
    sql(url, SEED_SQL.format(count=int(count)))
    sql(url, "VACUUM ANALYZE outbox_events")
    sql(url, "CHECKPOINT")


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def where_the_time_went(metrics_text, cpu_seconds, seconds):
    """From the relay's /metrics at the end of a drain: the seconds its sink spent publishing
    batches (outbox_relay_publish_duration_seconds: until every event of a batch is acknowledged)
    and its claims took, against the drain's wall time; and the relay's CPU over the drain."""
    def total(name):
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", metrics_text, re.M))
    publish, claims = total("outbox_relay_publish_duration_seconds_sum"), total("outbox_relay_claim_duration_seconds_sum")
    batches = total("outbox_relay_publish_duration_seconds_count")
    return {"publish_seconds": round(publish, 3), "publish_share": round(publish / seconds, 3),
            "batches": int(batches), "ms_per_batch": round(publish / batches * 1000, 2) if batches else None,
            "claim_seconds": round(claims, 3), "claim_share": round(claims / seconds, 3),
            "relay_cpu_seconds": round(cpu_seconds, 3),
            "relay_cores": round(cpu_seconds / seconds, 3)}


def timed_drain(url, relay_bin, work: Path, name, sink, events, batch_size, log_path: Path, log_level="info",
                timeout=600) -> dict:
    """Drains the pending events with a relay publishing to `sink`; valid when every row is marked
    and the relay exited 0 on SIGTERM. rate = events / seconds. Also where the time went (the
    relay's /metrics and CPU at the end: where_the_time_went). batch_size None: the relay's
    default."""
    listen = f"127.0.0.1:{free_port()}"
    cfg = {"database": {"url": url}, "relay": {} if batch_size is None else {"batch_size": batch_size},
           "http": {"enabled": True, "listen": listen}, "log": {"level": log_level}, "sinks": [sink]}
    path = work / f"drain-{name}.yaml"
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    max_id = sql(url, "SELECT max(id) FROM outbox_events")[0][0]
    probe = ("SELECT count(*) FROM outbox_events WHERE id > %s AND processed_at IS NULL "
             "AND dead_lettered_at IS NULL")
    with psycopg.connect(url, autocommit=True) as conn, open(log_path, "w") as log_file:
        t0 = time.monotonic()
        relay = subprocess.Popen([relay_bin, "run", "--config", str(path)], stdout=subprocess.DEVNULL,
                                 stderr=log_file)
        deadline = t0 + timeout
        t_done = None
        while time.monotonic() < deadline and relay.poll() is None:
            if conn.execute(probe, (max_id - 1000,)).fetchone()[0] == 0:
                t_done = time.monotonic()
                break
            time.sleep(0.002)
        breakdown = None
        if t_done is not None:
            try:
                cpu = process_cpu_seconds(relay.pid)
                with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as r:
                    breakdown = where_the_time_went(r.read().decode(), cpu, t_done - t0)
            except OSError as e:  # reported, the figure stands without it
                breakdown = {"error": repr(e)}
        relay.terminate()
        code = relay.wait(timeout=30)
    unprocessed = sql(url, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")[0][0]
    ok = t_done is not None and unprocessed == 0 and code == 0
    out = {"events": events, "unprocessed_after": unprocessed, "relay_exit_code": code, "valid": ok}
    if ok:
        out["seconds"] = round(t_done - t0, 3)
        out["rate"] = round(events / (t_done - t0), 1)
        out["where"] = breakdown
    return out


def file_drain(url, relay_bin, work: Path, events, batch_size, log_path: Path, log_level="info") -> dict:
    """timed_drain to the file sink with fsync; valid also needs one line per event."""
    target = work / "drain-sink.jsonl"
    target.unlink(missing_ok=True)
    r = timed_drain(url, relay_bin, work, "file", {"name": "file", "type": "file", "path": str(target), "fsync": True},
                    events, batch_size, log_path, log_level)
    r["lines"] = sum(1 for _ in open(target)) if target.exists() else 0
    r["valid"] = r["valid"] and r["lines"] == events
    target.unlink(missing_ok=True)
    return r


def steady_writers(url, rate, seconds, threads=8):
    """Single-row INSERT transactions at a steady total rate from several connections, as
    an application would write. Returns {id: wall-clock time when its COMMIT returned}."""
    committed = {}
    lock = threading.Lock()
    start = time.monotonic() + 0.5
    end = start + seconds
    errors = []

    def run(k):
        interval = threads / rate
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                due = start + k * interval / threads
                while due < end:
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    oid = conn.execute(
                        "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', %s, "
                        "jsonb_build_object('order_id', 1, 'amount_cents', 4200, 'currency', 'EUR')) RETURNING id",
                        (f"order-{random.randrange(10000)}",)).fetchone()[0]
                    t = time.time()  # autocommit: the COMMIT has returned
                    with lock:
                        committed[oid] = t
                    due += interval
        except Exception as e:  # reported below; a writer that dies invalidates the run
            errors.append(repr(e))

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"writers failed: {errors[:3]}")
    return committed
