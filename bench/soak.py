#!/usr/bin/env python3
"""Scale over time (issue 11), on a cluster that bench/soak.sh started: does the relay's cost stay
flat as the backlog, the table's history and the hours grow? outbox_events is migrated by the
binary under test; the relay drains to a file sink (fsync, batch_size 500) with its HTTP listener
on a free local port (/readyz, /metrics), DATABASE_URL in its environment. The cluster gets
max_wal_size 8GB and the settings of --pg-settings (RECOMMENDED_PG_SETTINGS below; 'none': PostgreSQL's
defaults), and logs every autovacuum run.

1. Backlog size: N (200,000) and 10 N (2,000,000) pending events, seeded in one INSERT (the
   payload of bench/run.sh, about 100 bytes of JSON; one key per 20 events in both), VACUUM
   ANALYZE, CHECKPOINT; then a relay drains them: events / (last line in the sink - relay ready).
   --backlog-rounds (3) pairs, small then large; their medians are compared. Target: the large
   drain >= 0.8 x the events/s of the small one.
2. History: N pending events in a table that also holds H (10,000,000) processed rows (seeded
   with processed_at set, below the pending ids; on_success mark, no retention), against the same
   drain with no history (point 1's small drain, on a table of its own), --history-rounds (3)
   times, taking turns; the medians are compared. Claim p99 from the relay's
   outbox_relay_claim_duration_seconds histogram (delta over the drain, interpolated inside its
   bucket as Prometheus' histogram_quantile does). Targets: >= 0.9 x the events/s, claim p99 <=
   1.5 x.
3. Soak: paced writers (pgbench -R RATE -c 8 -j 2, one INSERT of --events-per-txn (10) events a
   transaction, the events of bench/steady.sh) for --soak-minutes (30) at --soak-rate (default: 40 %
   of point 1's small drain rate), with a relay running on_success mark + retention 2m, then again
   on a fresh table with on_success delete. Every 30 s: the table's, its TOAST's and each index's
   size, n_live_tup/n_dead_tup, autovacuum and autoanalyze runs, the share of the window's updates
   that were HOT, commit-to-sink p50/p99/max of the lines that reached the sink in the window (the
   line's arrival time minus the row's created_at, as in bench/steady.py: created_at is the start of
   the writer's INSERT, so this includes the writer's own commit), the same from the moment the
   COMMIT returned for the events of a probe writer beside them (PROBE_RATE single-event
   transactions a second, every one logged; its events' p99 per window), what the cluster's
   statements running for over 20 ms wait for (pg_stat_activity every 50 ms), relay CPU and Postgres
   CPU (the whole cluster: writers' backends, the relay's sessions, autovacuum, checkpointer) per
   event, the p99 of the relay's claim and publish calls (its histograms), the relay's own
   created_at-to-ack p99 and share of events over 20 ms (its delivery histogram: the tailer's figure
   lags when this process waits for a core), how many seconds of the window had an event over 20 ms,
   the largest dirty page cache (/proc/meminfo), the machine's busy cores (/proc/stat; of which
   steal, pgbench's own CPU, and foreign: the rest beside Postgres, the relay, pgbench and this
   process, steal included) and the share of the window in which a runnable task waited for a core
   (/proc/pressure/cpu "some"). Before the soaks, the same writers run alone for
   --writers-alone-seconds (60; no relay, empty table): Postgres per event and the cores without the
   relay, so that the report gives the relay's share (its process plus the Postgres work it causes).
   Targets: after minute 10 the table + TOAST + indexes stay within +-25 % of the minute-10 size;
   every window's p99 <= 20 ms; CPU per event (relay + Postgres) in the last 10 minutes <= 1.2 x the
   first 10 minutes. Every id up to the last one written reaches the sink exactly once. Plot:
   bench/figures/soak-<mode>.png (size, dead tuples, latency per window).
4. Catch-up: writers at the soak rate; the relay is stopped until the backlog reaches
   --catchup-backlog (1,000,000); then it starts (mark + retention 2m) while the writers go on.
   Time until the backlog is gone (pending < what the writers add in 100 ms), the catch-up rate
   (events that reached the sink in that time / time) against point 1's quiet drain, and the
   writers' commit latency p99 during the catch-up against the mark soak's (pgbench -l, 10 %
   of transactions sampled).

Prints a markdown table of points 1-4 with the targets and whether each held; writes one JSON
file (--out). Standard library only, except matplotlib for the plots (skipped without it)."""
from __future__ import annotations

import argparse
import bisect
import datetime as dt
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pgcost as pc  # noqa: E402

TAG = "soak"
# Server settings docs/performance.md recommends for high steady rates, on by default in the soak's cluster
# (bench/RESULTS.md, "Scale over time"): backends and autovacuum start the kernel's write-back of
# what they write every 256kB, instead of letting the page cache gather hundreds of MiB that the
# kernel then writes at once, stalling the WAL flushes of writers' commits (and with them every
# event above the stalled writer's id). wal_compression=lz4 was tried for the burst of full-page
# images after each checkpoint starts and made no difference here.
# wal_init_zero=off: a new WAL segment is created by the backend (or WAL writer) that needs it, in
# its WAL write, holding WALWriteLock; with the default it first writes the segment's 16 MiB of
# zeros and fsyncs them, and every commit waits meanwhile. At 16,600 events/s (13 MB/s of WAL) that
# was a new segment every ~1.2 s until the first checkpoints recycle old ones, and 19-28 of every
# 30 seconds had an event over 20 ms (mark soak, 6 min); off (the segment created sparse): 4-22.
RECOMMENDED_PG_SETTINGS = "backend_flush_after=256kB,wal_init_zero=off"
SAMPLE_SECONDS = 30.0
P99_TARGET_MS = 20.0  # point 3: every window's commit-to-sink p99 at most this
# The probe writer beside the soak's writers: one pgbench client of single-event transactions,
# every one logged, so that each probe event's sink arrival can be set against the moment its
# COMMIT returned (not its created_at, the start of its INSERT: that includes the writer's own
# commit). Its own topic tells its lines apart in the sink.
PROBE_TOPIC = "order.probe"
# Point 2's drains without history run on a table of their own beside outbox_events (which keeps
# the history), so that the two kinds of drain can take turns.
NO_HISTORY_TABLE = "outbox_nohistory"
SEED_PAYLOAD = ("jsonb_build_object('order_id', g, 'amount_cents', 1999, 'currency', 'EUR', "
                "'customer', 'c-00042', 'status', 'paid')")
PROBE_RATE = 100


def log(msg):
    pc.log(TAG, msg)


# ----------------------------------------------------------------------------------------------
# The sink, read as it grows: no line is kept (a soak writes tens of millions).

PROBE_MARK = b'"topic":"' + PROBE_TOPIC.encode() + b'"'


class StreamTailer(pc.Tailer):
    """pgcost.Tailer that keeps no line: per line, the id (delivered once?) and the commit-to-sink
    latency = arrival - created_at, kept for the current window only."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.n = 0
        self.window = []          # latencies (ms) since the last take()
        self.seconds = {}         # arrival second (epoch, int) -> worst latency (ms) in it, since the last take()
        self.seen = bytearray()   # seen[id]: times delivered (saturating)
        self.duplicates = 0
        self.max_id = 0
        self.last_arrival = None  # time.monotonic() of the newest line
        self.last_latency_ms = None
        self.probes = []          # (id, arrival epoch s) of the probe writer's lines

    def count(self) -> int:
        return self.n

    def take_lines(self, lines, now):
        mono = time.monotonic()
        lat = []
        ids = []
        probes = []
        for line in lines:
            if not line:
                continue
            # {"id":N,"topic":...,"created_at":"..."}  (the file sink's line, relay/src/sinks/file/file_sink.cpp)
            ids.append(int(line[6:line.index(b",", 6)]))
            if PROBE_MARK in line:
                probes.append((ids[-1], now))
            c = line.rindex(b'"created_at":"') + 14
            created = dt.datetime.fromisoformat(line[c:line.index(b'"', c)].decode()).timestamp()
            lat.append((now - created) * 1000.0)
        if not ids:
            return
        with self.lock:
            top = max(ids)
            if top >= len(self.seen):
                self.seen.extend(bytes(top + 1 - len(self.seen) + (1 << 20)))
            for i in ids:
                if self.seen[i]:
                    self.duplicates += 1
                if self.seen[i] < 255:
                    self.seen[i] += 1
            self.max_id = max(self.max_id, top)
            self.n += len(ids)
            self.window.extend(lat)
            sec = int(now)
            self.seconds[sec] = max(self.seconds.get(sec, 0.0), max(lat))
            self.probes.extend(probes)
            self.last_arrival = mono
            self.last_latency_ms = lat[-1]

    def take(self):
        """(lines since the start, latencies of the window) and a new window."""
        with self.lock:
            w, self.window = self.window, []
            return self.n, w

    def take_seconds(self) -> int:
        """How many seconds since the previous call had a line over 20 ms: one long stall or a
        tail spread over the window?"""
        with self.lock:
            s, self.seconds = self.seconds, {}
        return sum(1 for v in s.values() if v > P99_TARGET_MS)

    def missing(self, up_to: int) -> int:
        with self.lock:
            n = min(up_to + 1, len(self.seen))
            return sum(1 for i in range(1, n) if not self.seen[i]) + max(0, up_to + 1 - len(self.seen))

    def stop(self):
        self._halt.set()
        self.join(timeout=10)


# ----------------------------------------------------------------------------------------------

def quantile_from_buckets(buckets: list, q: float):
    """Prometheus histogram_quantile: buckets [(le, cumulative count)] sorted by le."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return None


def histogram(m: dict, name: str) -> list:
    out = []
    for key, v in m.items():
        if key.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', key).group(1)
            out.append((float("inf") if le == "+Inf" else float(le), v))
    return sorted(out)


def histogram_delta(before: dict, after: dict, name: str) -> list:
    b = dict(histogram(before, name))
    return [(le, c - b.get(le, 0.0)) for le, c in histogram(after, name)]


class DirtySampler(threading.Thread):
    """The kernel's dirty page cache (/proc/meminfo Dirty, kB) twice a second; take() gives the
    largest since the previous take (MiB): a write-back burst delays the WAL flushes of writers'
    commits on the same disk."""

    def __init__(self):
        super().__init__(daemon=True)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._max = 0

    def run(self):
        while not self._halt.wait(0.5):
            try:
                kb = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("Dirty:"))
            except (OSError, StopIteration, ValueError):
                continue
            with self._lock:
                self._max = max(self._max, kb)

    def take(self) -> float:
        with self._lock:
            v, self._max = self._max, 0
        return round(v / 1024, 1)

    def stop(self):
        self._halt.set()


class WaitSampler(threading.Thread):
    """What the cluster's statements that have run for over 20 ms are doing, sampled every 50 ms
    from pg_stat_activity through one psql session: take() gives, since the previous take, the
    samples per (application, wait event), 'CPU' for none (running, or waiting for a core)."""

    SQL = ("SELECT coalesce(nullif(application_name, ''), backend_type) || '|' || "
           "coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity "
           "WHERE state = 'active' AND pid <> pg_backend_pid() AND clock_timestamp() - query_start > interval '20 ms' "
           "AND backend_type IN ('client backend', 'autovacuum worker')")

    def __init__(self, env: dict, stderr_path: Path):
        super().__init__(daemon=True)
        self.session = pc.PsqlSession(env, stderr_path)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._counts = {}
        self.samples = 0

    def run(self):
        while not self._halt.wait(0.05):
            try:
                rows = self.session.run(self.SQL + ";")
            except RuntimeError:
                return
            with self._lock:
                self.samples += 1
                for row in rows:
                    self._counts[row] = self._counts.get(row, 0) + 1

    def take(self) -> dict:
        """The most frequent (application|wait) pairs since the previous take, with the samples taken."""
        with self._lock:
            c, self._counts = self._counts, {}
            n, self.samples = self.samples, 0
        top = dict(sorted(c.items(), key=lambda kv: -kv[1])[:6])
        return {"wait_samples": n, "slow_waits": top}

    def stop(self):
        self._halt.set()
        self.join(timeout=5)
        self.session.close()


def count_above(buckets: list, le: float):
    """Observations above the bucket bound `le` (one of the histogram's bounds), or None."""
    at = dict(buckets).get(le)
    return None if at is None or not buckets else int(buckets[-1][1] - at)


def stage_p99s(before: dict, after: dict) -> dict:
    """Where a window's tail is: p99 (ms) of the relay's claim statements (which also write the
    previous batches' outcomes) and of its sink's publish calls (the file sink's write + fdatasync),
    from the relay's histograms between two scrapes."""
    out = {}
    for stage, calls in (("claim", "claims"), ("publish", "publishes")):
        q = quantile_from_buckets(histogram_delta(before, after, f"outbox_relay_{stage}_duration_seconds"), 0.99)
        out[f"{stage}_p99_ms"] = None if q is None else round(1000 * q, 2)
        # A single stall (one slow statement or fdatasync) holds back every event behind it but
        # does not move a p99 over thousands of calls: the calls of 100 ms or more, counted.
        out[f"{calls}_over_100ms"] = count_above(histogram_delta(before, after, f"outbox_relay_{stage}_duration_seconds"), 0.1)
    # The relay's own created_at-to-ack latency (buckets 5, 10, 20, 25, 50, 100 ms ...): a check on
    # the tailer's figure, which lags when the bench process waits for a core. Its share of events
    # over 20 ms is exact (a bucket ends there; None with binaries older than 2026-12-02): p99 <=
    # 20 ms means a share <= 1 %.
    lat = histogram_delta(before, after, "outbox_relay_delivery_latency_seconds")
    q = quantile_from_buckets(lat, 0.99)
    out["relay_delivery_p99_ms"] = None if q is None else round(1000 * q, 2)
    at20 = dict(lat).get(P99_TARGET_MS / 1000)
    out["relay_over_20ms_pct"] = (round(100 * (1 - at20 / lat[-1][1]), 3)
                                  if at20 is not None and lat and lat[-1][1] > 0 else None)
    return out


class Soak:
    def __init__(self, a, relay_bin):
        self.a = a
        self.relay_bin = relay_bin
        self.work = Path(a.work)
        self.db = pc.Db(a.url, a.pg_dir)
        self.script = pc.insert_script(self.work / "insert.sql", "outbox_events", a.events_per_txn)
        self.probe_script = self.work / "probe.sql"
        self.probe_script.write_text("\\set k random(1, 1000)\n\\set o random(1, 10000000)\n"
                                     "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES "
                                     f"{pc.event_values(':k', ':o', topic=PROBE_TOPIC)};\n")

    # -- table ----------------------------------------------------------------------------------
    def reset(self):
        self.db.psql("TRUNCATE outbox_events RESTART IDENTITY", "VACUUM outbox_events", "CHECKPOINT")

    def seed(self, pending: int, history: int = 0):
        """history processed rows (ids 1..history), then `pending` pending rows; one key per 20
        events of the pending rows, the payload of bench/run.sh's seed."""
        t0 = time.monotonic()
        self.db.psql("TRUNCATE outbox_events RESTART IDENTITY")
        step = 1_000_000
        for lo in range(1, history + 1, step):
            hi = min(history, lo + step - 1)
            self.db.psql("INSERT INTO outbox_events (topic, aggregate_id, payload, created_at, processed_at) "
                         f"SELECT 'order.paid', 'order-' || (g % {max(1, history // 20)}), {SEED_PAYLOAD}, "
                         f"now() - interval '1 day', now() - interval '1 day' FROM generate_series({lo}, {hi}) AS g")
        if pending:
            self.add_pending("outbox_events", pending)
        else:
            self.db.psql("VACUUM (ANALYZE) outbox_events", "CHECKPOINT")
        log(f"seeded {pending:,} pending + {history:,} processed rows in {time.monotonic() - t0:.0f} s")

    def add_pending(self, table: str, pending: int) -> int:
        """`pending` pending rows at the end of `table` (one key per 20 events, the payload of
        bench/run.sh's seed), then VACUUM (ANALYZE) and CHECKPOINT; returns the first new id."""
        keys = max(1, pending // 20)
        first = self.db.psql(f"WITH n AS (INSERT INTO {table} (topic, aggregate_id, payload) "
                             f"SELECT 'order.paid', 'order-' || (g % {keys}), {SEED_PAYLOAD} "
                             f"FROM generate_series(1, {pending}) AS g RETURNING id) SELECT min(id) FROM n")
        self.db.psql(f"VACUUM (ANALYZE) {table}", "CHECKPOINT")
        return int(first)

    def sizes(self) -> dict:
        rows = self.db.psql(
            "SELECT 'table', pg_relation_size('outbox_events') UNION ALL "
            "SELECT 'toast', coalesce(pg_relation_size(reltoastrelid), 0) FROM pg_class WHERE oid = 'outbox_events'::regclass "
            "UNION ALL SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) FROM pg_index i "
            "WHERE i.indrelid = 'outbox_events'::regclass")
        out = {}
        for r in rows.splitlines():
            k, _, v = r.partition("|")
            out[k] = int(v)
        out["total"] = sum(out.values())
        return out

    def stats(self) -> dict:
        r = self.db.psql("SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, "
                         "(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter), n_tup_upd, n_tup_hot_upd "
                         "FROM pg_stat_user_tables WHERE relid = 'outbox_events'::regclass").split("|")
        return {"n_live_tup": int(r[0]), "n_dead_tup": int(r[1]), "autovacuum_count": int(r[2]),
                "autoanalyze_count": int(r[3]), "checkpoints": int(r[4]), "n_tup_upd": int(r[5]),
                "n_tup_hot_upd": int(r[6])}

    def wal(self) -> dict:
        """pg_stat_wal's counters and the number of segment files in pg_wal: a window's WAL volume,
        its full-page images, how often a backend found the WAL buffers full, and how many new
        segment files appeared (each one written in full, zeros, and fsynced by the backend that
        needed it while it holds the WAL write lock: until checkpoints recycle old segments, on
        a fresh cluster, writers' commits wait for that)."""
        r = self.db.psql("SELECT wal_bytes, wal_fpi, wal_buffers_full, (SELECT count(*) FROM pg_ls_waldir()) "
                         "FROM pg_stat_wal").split("|")
        return {"wal_bytes": int(r[0]), "wal_fpi": int(r[1]), "wal_buffers_full": int(r[2]), "wal_files": int(r[3])}

    @staticmethod
    def wal_window(before: dict, after: dict) -> dict:
        return {"wal_mib": round((after["wal_bytes"] - before["wal_bytes"]) / 2**20, 1),
                "wal_fpi": after["wal_fpi"] - before["wal_fpi"],
                "wal_buffers_full": after["wal_buffers_full"] - before["wal_buffers_full"],
                "wal_files": after["wal_files"], "wal_files_added": after["wal_files"] - before["wal_files"]}

    def last_id(self) -> int:
        return int(self.db.psql("SELECT coalesce(max(id), 0) FROM outbox_events") or 0)

    def sequence_last(self) -> int:
        return int(self.db.psql("SELECT coalesce(last_value, 0) FROM outbox_events_id_seq") or 0)

    # -- relay ----------------------------------------------------------------------------------
    def start_relay(self, name, table=None, **relay_opts):
        sink = self.work / f"{name}-sink.jsonl"
        sink.unlink(missing_ok=True)
        port = pc.free_port()
        opts = {"batch_size": self.a.batch_size}
        opts.update(relay_opts)
        cfg = pc.write_relay_config(self.work / f"{name}.yaml", sink, port, opts, self.a.relay_config_extra,
                                    fsync=not self.a.no_sink_fsync, table=table)
        tailer = StreamTailer(sink)
        tailer.start()
        relay = pc.Relay(self.relay_bin, cfg, self.db.relay_env(), self.work / f"{name}.log", port)
        try:
            relay.wait_ready()
        except Exception:
            relay.stop()
            tailer.stop()
            raise
        return relay, tailer

    def stop_relay(self, relay, tailer):
        code = relay.stop()
        tailer.stop()
        if tailer.error:
            raise RuntimeError(f"tailer failed: {tailer.error}")
        if code != 0:
            raise RuntimeError(f"relay exited with {code}:\n{relay.log_tail()}")

    # -- 1 and 2 --------------------------------------------------------------------------------
    def drain(self, name, pending, history=0, **relay_opts):
        self.seed(pending, history)
        return self.measure_drain(name, history + 1, pending, history, **relay_opts)

    def measure_drain(self, name, first, pending, history, table=None, **relay_opts):
        """A relay started on `pending` events with ids from `first` on; until the last one is in the sink."""
        relay, tailer = self.start_relay(name, table=table, **relay_opts)
        t0 = time.monotonic()
        m0 = relay.metrics()
        s0 = pc.Snapshot(self.db.postmaster, relay.pid)
        deadline = t0 + self.a.drain_timeout
        while tailer.count() < pending:
            if time.monotonic() > deadline or not relay.alive():
                relay.stop()
                tailer.stop()
                raise RuntimeError(f"{name}: {tailer.count():,} of {pending:,} events after "
                                   f"{time.monotonic() - t0:.0f} s\n{relay.log_tail()}")
            time.sleep(0.05)
        t1 = tailer.last_arrival
        s1 = pc.Snapshot(self.db.postmaster, relay.pid)
        m1 = relay.metrics()
        self.stop_relay(relay, tailer)
        missing = sum(1 for i in range(first, first + pending) if i >= len(tailer.seen) or not tailer.seen[i])
        claims = histogram_delta(m0, m1, "outbox_relay_claim_duration_seconds")
        cpu = pc.window(s0, s1)
        r = {"pending": pending, "history": history, "seconds": round(t1 - t0, 3),
             "events_per_s": round(pending / (t1 - t0), 1), "missing": missing, "duplicated": tailer.duplicates,
             "claims": int(claims[-1][1]) if claims else None,
             "claim_p50_ms": round(1000 * (quantile_from_buckets(claims, 0.5) or 0), 3),
             "claim_p99_ms": round(1000 * (quantile_from_buckets(claims, 0.99) or 0), 3),
             "relay_us_per_event": round(1e6 * (cpu["relay_cpu_seconds"] or 0) / pending, 2),
             "postgres_us_per_event": round(1e6 * cpu["postgres_cpu_seconds"] / pending, 2),
             "foreign_cores": cpu["foreign_cores"]}
        if table is None:
            r["sizes_after"] = self.sizes()
        log(f"{name}: {pending:,} events (history {history:,}) in {r['seconds']:.1f} s = {r['events_per_s']:,.0f}/s, "
            f"claim p99 {r['claim_p99_ms']} ms, missing {missing}, duplicated {tailer.duplicates}")
        return r

    def backlog(self):
        """--backlog-rounds pairs of drains, small then large, each on a table seeded afresh; the
        medians are compared (one drain of seconds moves by tens of percent on a busy VM)."""
        n = self.a.backlog
        runs = {"small": [], "large": []}
        for k in range(1, self.a.backlog_rounds + 1):
            runs["small"].append(self.drain(f"backlog-small-{k}", n))
            runs["large"].append(self.drain(f"backlog-large-{k}", n * self.a.backlog_factor))
        return {kind: median_drain(rs) for kind, rs in runs.items()}

    def sustained(self, seconds=20.0):
        """The relay's drain rate while writers share the machine with it: unpaced writers (the soak's
        transactions, 8 connections) and a relay (on_success mark) for `seconds`; events that reach
        the sink per second between 5 s and seconds - 5 s, and what the writers committed."""
        self.reset()
        relay, tailer = self.start_relay("sustained", on_success="mark")
        p = pc.pgbench(self.db.env, self.script, self.a.clients, self.a.jobs, seconds, popen=True)
        time.sleep(5)
        c0, t0, id0 = tailer.count(), time.monotonic(), self.sequence_last()
        time.sleep(seconds - 10)
        c1, t1, id1 = tailer.count(), time.monotonic(), self.sequence_last()
        out, err = p.communicate(timeout=120)
        pc.parse_pgbench(p.returncode, out, err)
        self.stop_relay(relay, tailer)
        r = {"relay_events_per_s": round((c1 - c0) / (t1 - t0), 1), "writers_events_per_s": round((id1 - id0) / (t1 - t0), 1)}
        log(f"sustained: writers {r['writers_events_per_s']:,.0f}/s, relay {r['relay_events_per_s']:,.0f}/s")
        return r

    def history(self):
        """--history-rounds pairs of drains, taking turns: N events in a table of their own, then N
        more at the end of outbox_events, which holds the history (H processed rows, seeded once;
        each round's drained events add N more). The medians of the rounds are compared: one
        drain of a few seconds varies by a factor of two on a busy VM."""
        n, h = self.a.backlog, self.a.history_rows
        self.seed(0, h)
        pc.migrate(self.relay_bin, self.db.relay_env(), table=NO_HISTORY_TABLE)
        runs = {"without": [], "with": []}
        for k in range(1, self.a.history_rounds + 1):
            self.db.psql(f"TRUNCATE {NO_HISTORY_TABLE} RESTART IDENTITY")
            first = self.add_pending(NO_HISTORY_TABLE, n)
            runs["without"].append(self.measure_drain(f"history-none-{k}", first, n, 0, table=NO_HISTORY_TABLE))
            first = self.add_pending("outbox_events", n)
            runs["with"].append(self.measure_drain(f"history-{k}", first, n, h + (k - 1) * n))
        return {kind: median_drain(rs) for kind, rs in runs.items()}

    # -- 3 and 4 --------------------------------------------------------------------------------
    def writers(self, seconds, log_prefix, popen=True):
        """pgbench at the soak rate, 10 % of its transactions logged: the process (popen) or, once
        it has ended, its figures."""
        env = {**self.db.env, "PGAPPNAME": "soak-writers"}
        if self.a.writers_async_commit:
            env = {**env, "PGOPTIONS": (env.get("PGOPTIONS", "") + " -c synchronous_commit=off").strip()}
        return pc.pgbench(env, self.script, self.a.clients, self.a.jobs, seconds,
                          rate=self.a.soak_rate / self.a.events_per_txn,
                          popen=popen, log_prefix=log_prefix, extra=["--sampling-rate=0.1"])

    def writers_alone(self, seconds):
        """The soak's writers with no relay, on an empty table: what Postgres spends per event on
        the writers' own work and how crowded the cores are without the relay. A soak's figures
        less these are the relay's share (the relay process and the Postgres work it causes)."""
        self.reset()
        log(f"writers alone (no relay) at {self.a.soak_rate:,}/s for {seconds:g} s")
        s0 = pc.Snapshot(self.db.postmaster)
        wr = self.writers(seconds, self.work / "alone-txn", popen=False)
        time.sleep(0.1)  # the postmaster reaps the writers' backends
        s1 = pc.Snapshot(self.db.postmaster)
        if wr["exit_code"] != 0:
            raise RuntimeError(f"writers alone: pgbench exited {wr['exit_code']}")
        cpu = pc.window(s0, s1)
        events = self.sequence_last()
        r = {"seconds": seconds, "events": events, "writer_txn": pc.txn_log_summary(self.work / "alone-txn"),
             "postgres_us": round(1e6 * cpu["postgres_cpu_seconds"] / events, 1) if events else None,
             "client_cores": round(cpu["client_cpu_seconds"] / cpu["wall_seconds"], 3),
             **{k: cpu[k] for k in ("machine_cores", "steal_cores", "foreign_cores", "cpu_pressure")}}
        log(f"  writers alone: {events:,} events, Postgres {pc.fmt(r['postgres_us'], 1)} us/event, cores busy "
            f"{pc.fmt(r['machine_cores'], 2)} (pgbench {r['client_cores']:.2f}, steal {pc.fmt(r['steal_cores'], 2)}), "
            f"waiting for a core {fmt_share(r['cpu_pressure'])} %")
        return r

    def soak(self, mode):
        a = self.a
        seconds = a.soak_minutes * 60
        self.reset()
        opts = {"on_success": mode}
        if mode == "mark":
            opts["retention"] = a.retention
        relay, tailer = self.start_relay(f"soak-{mode}", **opts)
        prefix = self.work / f"soak-{mode}-txn"
        writers = self.writers(seconds, prefix)
        probe_prefix = self.work / f"soak-{mode}-probe"
        probe = pc.pgbench({**self.db.env, "PGAPPNAME": "soak-probe"}, self.probe_script, 1, 1, seconds, rate=PROBE_RATE, popen=True,
                           log_prefix=probe_prefix)
        t0 = time.monotonic()
        wall0 = time.time()
        clients = (writers.pid, probe.pid)
        snap = pc.Snapshot(self.db.postmaster, relay.pid, clients)
        m_prev = relay.metrics()
        wal_prev = self.wal()
        dirty = DirtySampler()
        dirty.start()
        waits = WaitSampler(self.db.env, self.work / f"soak-{mode}-waits.err")
        waits.start()
        tailer.take()
        tailer.take_seconds()
        stats0 = self.stats()
        windows = []
        log(f"soak ({mode}{', retention ' + a.retention if mode == 'mark' else ''}) at {a.soak_rate:,}/s "
            f"for {a.soak_minutes:g} min; a sample every {SAMPLE_SECONDS:g} s")
        try:
            k = 1
            while True:
                target = t0 + k * SAMPLE_SECONDS
                if k * SAMPLE_SECONDS > seconds + 0.5:
                    break
                time.sleep(max(0.0, target - time.monotonic()))
                if not relay.alive():
                    raise RuntimeError(f"relay exited:\n{relay.log_tail()}")
                s = pc.Snapshot(self.db.postmaster, relay.pid, clients)
                count, lat = tailer.take()
                seconds_over = tailer.take_seconds()
                cpu = pc.window(snap, s)
                m = relay.metrics()
                wal = self.wal()
                events = count - (windows[-1]["lines_total"] if windows else 0)
                lat.sort()
                w = {"t_s": round(s.t - t0, 1), "wall_end": time.time(), "lines_total": count, "events": events,
                     "p50_ms": pc.pct(lat, 0.5), "p99_ms": pc.pct(lat, 0.99), "max_ms": pc.pct(lat, 1.0),
                     "seconds_over_20ms": seconds_over,
                     "relay_cpu_s": cpu["relay_cpu_seconds"], "postgres_cpu_s": cpu["postgres_cpu_seconds"],
                     "foreign_cores": cpu["foreign_cores"],
                     "client_cores": round(cpu["client_cpu_seconds"] / cpu["wall_seconds"], 3),
                     "machine_cores": cpu["machine_cores"], "steal_cores": cpu["steal_cores"],
                     "cpu_pressure": cpu["cpu_pressure"],
                     "relay_us": round(1e6 * cpu["relay_cpu_seconds"] / events, 1) if events else None,
                     "postgres_us": round(1e6 * cpu["postgres_cpu_seconds"] / events, 1) if events else None,
                     "sizes": self.sizes(), **self.stats(), **stage_p99s(m_prev, m),
                     "dirty_max_mib": dirty.take(), **self.wal_window(wal_prev, wal), **waits.take()}
                st_prev = windows[-1] if windows else stats0
                upd = w["n_tup_upd"] - st_prev["n_tup_upd"]
                w["hot_update_pct"] = round(100 * (w["n_tup_hot_upd"] - st_prev["n_tup_hot_upd"]) / upd, 1) if upd else None
                windows.append(w)
                snap, m_prev, wal_prev = s, m, wal
                k += 1
                log(f"  {w['t_s'] / 60:5.1f} min: {events / SAMPLE_SECONDS:7,.0f}/s, p50 {pc.fmt(w['p50_ms'], 2)} "
                    f"p99 {pc.fmt(w['p99_ms'], 2)} max {pc.fmt(w['max_ms'], 1)} ms ({seconds_over} s with one over 20), size {w['sizes']['total'] / 2**20:7.1f} MiB, "
                    f"dead {w['n_dead_tup']:,}, autovacuum {w['autovacuum_count']}, checkpoints {w['checkpoints']}, "
                    f"HOT updates {pc.fmt(w['hot_update_pct'], 0)} %, "
                    f"us/ev relay {pc.fmt(w['relay_us'], 1)} + PG {pc.fmt(w['postgres_us'], 1)}; "
                    f"cores busy {pc.fmt(w['machine_cores'], 2)} (pgbench {w['client_cores']:.2f}, steal "
                    f"{pc.fmt(w['steal_cores'], 2)}, foreign {pc.fmt(w['foreign_cores'], 2)}), waiting for a core "
                    f"{fmt_share(w['cpu_pressure'])} %; "
                    f"p99 claim {pc.fmt(w['claim_p99_ms'], 1)} publish {pc.fmt(w['publish_p99_ms'], 1)} "
                    f"(>= 100 ms: {w['claims_over_100ms']} claims, {w['publishes_over_100ms']} publishes), "
                    f"delivery (relay's histogram) {pc.fmt(w['relay_delivery_p99_ms'], 1)} ms, "
                    f"{pc.fmt(w['relay_over_20ms_pct'], 2)} % over 20 ms, "
                    f"dirty <= {w['dirty_max_mib']:.0f} MiB; WAL {w['wal_mib']:.0f} MiB, {w['wal_fpi']:,} FPI, "
                    f"buffers full {w['wal_buffers_full']:,}, files {w['wal_files']} (+{w['wal_files_added']}); "
                    f"over 20 ms ({w['wait_samples']} samples): "
                    + ", ".join(f"{k} {v}" for k, v in list(w["slow_waits"].items())[:4]))
            out, err = writers.communicate(timeout=120)
            wr = pc.parse_pgbench(writers.returncode, out, err)
            out, err = probe.communicate(timeout=120)
            pc.parse_pgbench(probe.returncode, out, err)
        finally:
            dirty.stop()
            waits.stop()
            for p in (writers, probe):
                if p.poll() is None:
                    p.terminate()
                    p.wait()
        # the last events: every id written reaches the sink exactly once
        last = self.sequence_last()
        deadline = time.monotonic() + 60
        while tailer.max_id < last or tailer.missing(last):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        missing = tailer.missing(last)
        duplicated = tailer.duplicates
        self.stop_relay(relay, tailer)
        r = {"mode": mode, "rate": a.soak_rate, "minutes": a.soak_minutes, "windows": windows, "writers": wr,
             "writer_txn": pc.txn_log_summary(prefix), "last_id": last, "missing": missing,
             "duplicated": duplicated, "wall_start": wall0,
             "probe": probe_windows(tailer.probes, probe_prefix, windows)}
        writer_windows(prefix, windows)
        r["figures"] = soak_figures(windows, a.soak_minutes)
        log(f"soak ({mode}): {last:,} events, missing {missing}, duplicated {duplicated}; {r['figures']}")
        return r

    def catchup(self):
        a = self.a
        self.reset()
        prefix = self.work / "catchup-txn"
        # writers for: the backlog's build-up, then at most the catch-up timeout
        build_s = a.catchup_backlog / a.soak_rate
        writers = self.writers(build_s + a.drain_timeout + 60, prefix)
        log(f"catch-up: writers at {a.soak_rate:,}/s with no relay until {a.catchup_backlog:,} events are pending "
            f"(~{build_s:.0f} s)")
        try:
            while self.sequence_last() < a.catchup_backlog:
                if writers.poll() is not None:
                    raise RuntimeError(f"writers ended: {writers.communicate()[1][-2000:]}")
                time.sleep(0.5)
            relay, tailer = self.start_relay("catchup", on_success="mark", retention=a.retention)
            t0 = time.monotonic()
            wall0 = time.time()
            backlog0 = self.db.pending()
            done_below = a.soak_rate / 10  # what the writers add in 100 ms
            deadline = t0 + a.drain_timeout
            while True:
                n = self.db.pending()
                if n < done_below:
                    break
                if time.monotonic() > deadline or not relay.alive():
                    raise RuntimeError(f"catch-up: {n:,} still pending after {time.monotonic() - t0:.0f} s\n"
                                       f"{relay.log_tail()}")
                time.sleep(0.25)
            t1 = time.monotonic()
            wall1 = time.time()
            delivered = tailer.count()
            lag_after = tailer.last_latency_ms
            # a few more seconds at the soak rate, then the writers stop
            time.sleep(5)
        finally:
            writers.terminate()
            writers.communicate(timeout=60)
        last = self.sequence_last()
        deadline = time.monotonic() + 60
        while tailer.missing(last) and time.monotonic() < deadline:
            time.sleep(0.2)
        missing, duplicated = tailer.missing(last), tailer.duplicates
        self.stop_relay(relay, tailer)
        r = {"backlog_at_start": backlog0, "seconds": round(t1 - t0, 2), "delivered": delivered,
             "events_per_s": round(delivered / (t1 - t0), 1), "latency_after_ms": lag_after,
             "writer_txn_catchup": pc.txn_log_summary(prefix, wall0, wall1),
             "writer_txn_before": pc.txn_log_summary(prefix, None, wall0),
             "missing": missing, "duplicated": duplicated, "last_id": last}
        log(f"catch-up: {backlog0:,} pending gone in {r['seconds']} s ({r['events_per_s']:,.0f}/s incl. new writes), "
            f"writers' p99 {r['writer_txn_catchup']['p99_ms']} ms; missing {missing}, duplicated {duplicated}")
        return r


def median_drain(runs: list) -> dict:
    """Rounds of the same drain: the median events/s and claim p99, each round's figures kept."""
    return {"pending": runs[0]["pending"], "history": runs[0]["history"],
            "events_per_s": pc.median([r["events_per_s"] for r in runs]),
            "claim_p99_ms": pc.median([r["claim_p99_ms"] for r in runs], 3),
            "missing": sum(r["missing"] for r in runs), "duplicated": sum(r["duplicated"] for r in runs),
            "foreign_cores": max((r["foreign_cores"] or 0) for r in runs), "rounds": runs}


def fmt_share(x):
    """A share (0..1) as a whole percentage, '-' when unknown."""
    return pc.fmt(None if x is None else 100 * x, 0)


def writer_windows(log_prefix: Path, windows: list):
    """The soak writers' own transactions (pgbench -l, 10 % sampled: INSERT of 10 events sent to
    COMMIT returned), per window of their COMMIT: p99 and the share over 20 ms, added to each
    window as writer_txn_*. A window whose writers' transactions took over 20 ms for more than
    1 % of them cannot hold the target whatever the relay does: created_at is their start."""
    ends = [w["wall_end"] for w in windows]
    per = [[] for _ in windows]
    for _, _, end, ms in pc.pgbench_log(log_prefix):
        i = bisect.bisect_left(ends, end)
        if i < len(per):
            per[i].append(ms)
    for w, v in zip(windows, per):
        v.sort()
        w.update({"writer_txn_n": len(v), "writer_txn_p99_ms": pc.pct(v, 0.99),
                  "writer_txn_over_20ms_pct": round(100 * sum(1 for x in v if x > P99_TARGET_MS) / len(v), 2) if v else None})


def probe_windows(probes: list, log_prefix: Path, windows: list) -> dict:
    """The probe writer's events, per window of their arrival: commit-to-sink from the moment the
    COMMIT returned to the writer (p50/p99/max, ms) and the probe's own transaction time (INSERT
    sent to COMMIT returned, pgbench -l: time - schedule lag). One client runs its transactions
    one after the other, so its k-th transaction in its log wrote its k-th id. Added to each
    window as probe_*; returns the totals (or why there are none)."""
    txns = sorted((txn, end, ms) for _, txn, end, ms in pc.pgbench_log(log_prefix))
    probes = sorted(probes)
    if not txns or len(txns) != len(probes):
        log(f"probe: {len(txns)} transactions logged, {len(probes)} probe events in the sink: not matched")
        return {"matched": False, "transactions": len(txns), "events": len(probes)}
    ends = [w["wall_end"] for w in windows]
    per = [([], []) for _ in windows]
    for (_, arrival), (_, committed, own_ms) in zip(probes, txns):
        i = bisect.bisect_left(ends, arrival)
        if i < len(per):
            per[i][0].append((arrival - committed) * 1000.0)
            per[i][1].append(own_ms)
    for w, (lat, own) in zip(windows, per):
        lat.sort()
        own.sort()
        w.update({"probe_n": len(lat), "probe_p50_ms": pc.pct(lat, 0.5), "probe_p99_ms": pc.pct(lat, 0.99),
                  "probe_max_ms": pc.pct(lat, 1.0), "probe_txn_p99_ms": pc.pct(own, 0.99),
                  "probe_txn_max_ms": pc.pct(own, 1.0)})
    return {"matched": True, "transactions": len(txns), "events": len(probes)}


def soak_figures(windows, minutes):
    f = {}
    if not windows:
        return f
    at10 = min(windows, key=lambda w: abs(w["t_s"] - 600))
    later = [w for w in windows if w["t_s"] > at10["t_s"]]
    base = at10["sizes"]["total"]
    if later and base:
        dev = [w["sizes"]["total"] / base - 1 for w in later]
        f["size_min10_mib"] = round(base / 2**20, 1)
        f["size_dev_min"], f["size_dev_max"] = round(min(dev), 3), round(max(dev), 3)
        f["size_held"] = max(abs(x) for x in dev) <= 0.25
    p99s = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    f["worst_window_p99_ms"] = max(p99s) if p99s else None
    f["windows_over_20ms"] = sum(1 for x in p99s if x > P99_TARGET_MS)
    f["p99_held"] = bool(p99s) and f["windows_over_20ms"] == 0
    shares = [w["relay_over_20ms_pct"] for w in windows if w.get("relay_over_20ms_pct") is not None]
    if shares:
        f["relay_worst_window_over_20ms_pct"] = max(shares)
        f["relay_windows_p99_over_20ms"] = sum(1 for x in shares if x > 1.0)
    probe = [w["probe_p99_ms"] for w in windows if w.get("probe_p99_ms") is not None]
    if probe:
        f["probe_worst_window_p99_ms"] = max(probe)
        f["probe_windows_over_20ms"] = sum(1 for x in probe if x > P99_TARGET_MS)

    def per_event(ws):
        ev = sum(w["events"] for w in ws)
        cpu = sum(w["relay_cpu_s"] + w["postgres_cpu_s"] for w in ws)
        return round(1e6 * cpu / ev, 1) if ev else None
    span = min(600, minutes * 60 / 3)
    first = [w for w in windows if w["t_s"] <= span + 0.5]
    last = [w for w in windows if w["t_s"] > windows[-1]["t_s"] - span + 0.5]
    f["cpu_us_first"], f["cpu_us_last"] = per_event(first), per_event(last)
    if f["cpu_us_first"] and f["cpu_us_last"]:
        f["cpu_ratio"] = round(f["cpu_us_last"] / f["cpu_us_first"], 3)
        f["cpu_held"] = f["cpu_ratio"] <= 1.2
    f["foreign_cores_max"] = max((w["foreign_cores"] or 0) for w in windows)
    writers = [w["writer_txn_over_20ms_pct"] for w in windows if w.get("writer_txn_over_20ms_pct") is not None]
    if writers:
        f["writer_txn_windows_over_1pct"] = sum(1 for x in writers if x > 1.0)
        f["writer_txn_worst_over_20ms_pct"] = max(writers)
    for k in ("machine_cores", "cpu_pressure", "relay_us", "postgres_us"):
        xs = sorted(w[k] for w in windows if w.get(k) is not None)
        if xs:
            f[k + "_median"] = xs[len(xs) // 2]
    return f


def plot(doc, out_dir: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot (apt-get install python3-matplotlib)")
        return []
    files = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for mode, r in doc.get("soak", {}).items():
        ws = r["windows"]
        t = [w["t_s"] / 60 for w in ws]
        fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
        ax1.plot(t, [w["sizes"]["total"] / 2**20 for w in ws], label="table + TOAST + indexes")
        ax1.plot(t, [w["sizes"]["table"] / 2**20 for w in ws], label="table (heap)")
        for k in ws[0]["sizes"]:
            if k not in ("table", "toast", "total"):
                ax1.plot(t, [w["sizes"].get(k, 0) / 2**20 for w in ws], label=k, linewidth=0.8)
        base = r["figures"].get("size_min10_mib")
        if base:
            ax1.axhspan(base * 0.75, base * 1.25, color="green", alpha=0.08, label="minute-10 size +-25 %")
        ax1.set_ylabel("MiB")
        ax1.legend(fontsize=7, loc="upper left")
        ax1.set_title(f"outbox_events, on_success: {mode}"
                      f"{', retention ' + doc['config']['retention'] if mode == 'mark' else ''}, "
                      f"{r['rate']:,} events/s for {r['minutes']:g} min")
        ax2.plot(t, [w["n_live_tup"] / 1000 for w in ws], label="n_live_tup (k)")
        ax2.plot(t, [w["n_dead_tup"] / 1000 for w in ws], label="n_dead_tup (k)")
        for i in range(1, len(ws)):
            if ws[i]["autovacuum_count"] > ws[i - 1]["autovacuum_count"]:
                ax2.axvline(t[i], color="grey", alpha=0.3, linewidth=0.8)
        ax2.set_ylabel("thousand rows")
        ax2.legend(fontsize=7, loc="upper left", title="grey lines: autovacuum ran", title_fontsize=7)
        ax3.plot(t, [w["p50_ms"] for w in ws], label="commit-to-sink p50 (from created_at)")
        ax3.plot(t, [w["p99_ms"] for w in ws], label="p99")
        if any(w.get("probe_p99_ms") is not None for w in ws):
            ax3.plot(t, [w.get("probe_p99_ms") for w in ws], label="p99 from the COMMIT's return (probe writer)",
                     linestyle=":")
        ax3.axhline(20, color="red", alpha=0.4, linestyle="--", label="p99 target 20 ms")
        ax3.set_ylabel("ms (30-s windows)")
        ax3.set_xlabel("minutes")
        ax3.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        path = out_dir / f"soak-{mode}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(str(path))
        log(f"plot: {path}")
    return files


def print_report(doc, a):
    out = [f"## bench/soak.sh: {doc['meta'].get('started_at', '')}", "",
           "cluster: " + ", ".join(f"{k} {v}" for k, v in {"max_wal_size": doc["meta"].get("max_wal_size"),
                                                            **doc["meta"].get("pg_settings", {})}.items()), ""]
    rows = []
    if "backlog" in doc:
        s, l = doc["backlog"]["small"], doc["backlog"]["large"]
        ratio = l["events_per_s"] / s["events_per_s"]
        each = "; rounds " + ", ".join(f"{x['events_per_s']:,.0f} vs {y['events_per_s']:,.0f}"
                                       for x, y in zip(l.get("rounds", []), s.get("rounds", [])))
        rows.append([f"1. drain {l['pending']:,} vs {s['pending']:,} pending: events/s, median of "
                     f"{len(l.get('rounds', [l]))} rounds",
                     f"{l['events_per_s']:,.0f} vs {s['events_per_s']:,.0f}/s = {ratio:.2f} x{each}", ">= 0.8 x",
                     pc.held(ratio >= 0.8 and not (s["missing"] or l["missing"] or s["duplicated"] or l["duplicated"]))])
    if "sustained" in doc:
        u = doc["sustained"]
        rows.append(["soak rate: 40 % of min(quiet drain, drain beside unpaced writers)",
                     f"{a.soak_rate:,}/s (quiet {doc['backlog']['small']['events_per_s']:,.0f}/s; beside writers "
                     f"{u['relay_events_per_s']:,.0f}/s, writers {u['writers_events_per_s']:,.0f}/s)", "report", "-"])
    if "history" in doc:
        w, h = doc["history"]["without"], doc["history"]["with"]
        ratio = h["events_per_s"] / w["events_per_s"]
        cratio = h["claim_p99_ms"] / w["claim_p99_ms"] if w["claim_p99_ms"] else float("nan")
        each = "; rounds " + ", ".join(f"{x['events_per_s']:,.0f} vs {y['events_per_s']:,.0f}"
                                       for x, y in zip(h.get("rounds", []), w.get("rounds", [])))
        rows.append([f"2. drain {h['pending']:,} with {h['history']:,} processed rows vs none: events/s, "
                     f"median of {len(h.get('rounds', [h]))} rounds",
                     f"{h['events_per_s']:,.0f} vs {w['events_per_s']:,.0f}/s = {ratio:.2f} x{each if 'rounds' in h else ''}",
                     ">= 0.9 x", pc.held(ratio >= 0.9 and not (h["missing"] or w["missing"] or h["duplicated"] or w["duplicated"]))])
        rows.append(["2. claim p99, median of the rounds", f"{h['claim_p99_ms']:.2f} vs {w['claim_p99_ms']:.2f} ms = {cratio:.2f} x",
                     "<= 1.5 x", pc.held(cratio <= 1.5)])
    alone = doc.get("writers_alone")
    if alone:
        rows.append([f"3. the writers alone (no relay), {a.soak_rate:,}/s, {alone['seconds']:g} s: Postgres per event, "
                     "cores busy, share of time a task waited for a core",
                     f"{pc.fmt(alone['postgres_us'], 1)} us, {pc.fmt(alone['machine_cores'], 2)} of {doc['meta'].get('nproc')}, "
                     f"{fmt_share(alone['cpu_pressure'])} %",
                     "report", "-"])
    for mode, r in doc.get("soak", {}).items():
        f = r["figures"]
        lbl = f"3. soak {mode}{' + retention ' + a.retention if mode == 'mark' else ''}, {r['rate']:,}/s, {r['minutes']:g} min"
        if "size_held" in f:
            rows.append([f"{lbl}: size after min 10 vs min 10 ({f['size_min10_mib']} MiB)",
                         f"{100 * f['size_dev_min']:+.1f} % .. {100 * f['size_dev_max']:+.1f} %", "within +-25 %",
                         pc.held(f["size_held"])])
        rows.append([f"{lbl}: worst 30-s window commit-to-sink p99", f"{pc.fmt(f['worst_window_p99_ms'], 2)} ms "
                     f"({f['windows_over_20ms']} windows over)", "<= 20 ms every window", pc.held(f["p99_held"])])
        if "relay_worst_window_over_20ms_pct" in f:
            rows.append([f"{lbl}: the same from the relay's histogram (created_at to the sink's ack): "
                         f"events over 20 ms, worst window", f"{f['relay_worst_window_over_20ms_pct']:.2f} % "
                         f"({f['relay_windows_p99_over_20ms']} windows with a p99 over 20 ms)", "<= 1 % every window",
                         pc.held(f["relay_windows_p99_over_20ms"] == 0)])
        if "probe_worst_window_p99_ms" in f:
            rows.append([f"{lbl}: the same from the COMMIT's return (probe writer, {PROBE_RATE}/s)",
                         f"{pc.fmt(f['probe_worst_window_p99_ms'], 2)} ms ({f['probe_windows_over_20ms']} windows over)",
                         "report", "-"])
        if "writer_txn_windows_over_1pct" in f:
            rows.append([f"{lbl}: the writers' own transactions (INSERT to COMMIT returned, 10 % sampled) over 20 ms, "
                         f"worst window", f"{f['writer_txn_worst_over_20ms_pct']:.2f} % "
                         f"({f['writer_txn_windows_over_1pct']} windows over 1 %)", "report", "-"])
        if "machine_cores_median" in f:
            rows.append([f"{lbl}: cores busy / share of time a task waited for a core, median window",
                         f"{f['machine_cores_median']:.2f} of {doc['meta'].get('nproc')} / "
                         f"{fmt_share(f.get('cpu_pressure_median'))} %",
                         "report", "-"])
        if alone and alone.get("postgres_us") and "postgres_us_median" in f and "relay_us_median" in f:
            relay_us, pg_us = f["relay_us_median"], f["postgres_us_median"]
            rows.append([f"{lbl}: the relay's share per event, median window: relay process + (Postgres - Postgres "
                         "with the writers alone)", f"{relay_us} + ({pg_us} - {alone['postgres_us']}) = "
                         f"{relay_us + pg_us - alone['postgres_us']:.1f} us", "report", "-"])
        if "cpu_ratio" in f:
            rows.append([f"{lbl}: CPU/event relay + Postgres, last vs first 10 min",
                         f"{f['cpu_us_last']} vs {f['cpu_us_first']} us = {f['cpu_ratio']:.2f} x", "<= 1.2 x",
                         pc.held(f["cpu_held"])])
        rows.append([f"{lbl}: every id once", f"{r['last_id']:,} ids, missing {r['missing']}, duplicated {r['duplicated']}",
                     "0 / 0", pc.held(not r["missing"] and not r["duplicated"])])
    if "catchup" in doc:
        c = doc["catchup"]
        quiet = doc.get("backlog", {}).get("small", {}).get("events_per_s")
        rows.append([f"4. catch-up of {c['backlog_at_start']:,} pending, writers on at {a.soak_rate:,}/s",
                     f"{c['seconds']:.1f} s, {c['events_per_s']:,.0f}/s"
                     + (f" = {c['events_per_s'] / quiet:.2f} x the quiet drain" if quiet else ""), "report", "-"])
        soak_p99 = doc.get("soak", {}).get("mark", {}).get("writer_txn", {}).get("p99_ms")
        rows.append(["4. writers' commit p99 during catch-up",
                     f"{pc.fmt(c['writer_txn_catchup']['p99_ms'], 2)} ms"
                     + (f" vs {pc.fmt(soak_p99, 2)} ms in the mark soak" if soak_p99 else ""), "report", "-"])
        rows.append(["4. every id once", f"{c['last_id']:,} ids, missing {c['missing']}, duplicated {c['duplicated']}",
                     "0 / 0", pc.held(not c["missing"] and not c["duplicated"])])
    out.append(pc.md_table(["point", "figure", "target", "held"], rows, ["---", "---:", "---", "---"]))
    fl = [x.get("foreign_cores") or 0 for k in ("backlog", "history") for x in doc.get(k, {}).values()]
    fl += [r["figures"].get("foreign_cores_max") or 0 for r in doc.get("soak", {}).values()]
    if fl:
        out += ["", f"Foreign load during the measurements: max {max(fl):.2f} cores"
                + ("  <- figures with foreign load are suspect" if max(fl) > 0.15 else "")]
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-dir", required=True, help="the cluster directory of scripts/pg-cluster.sh")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--out", required=True, help="result JSON file")
    ap.add_argument("--relay-bin", default=str(pc.ROOT / "build-bench" / "bin" / "outbox-relay"))
    ap.add_argument("--wait-for-bin", type=float, default=300)
    ap.add_argument("--points", default="1,2,3,4", help="which points to run [1,2,3,4]")
    ap.add_argument("--backlog", type=int, default=200_000, help="the small backlog of points 1 and 2 [200000]")
    ap.add_argument("--backlog-factor", type=int, default=10, help="the large backlog = factor x small [10]")
    ap.add_argument("--backlog-rounds", type=int, default=3, help="pairs of drains of point 1, medians compared [3]")
    ap.add_argument("--history-rows", type=int, default=10_000_000, help="processed rows of point 2 [10000000]")
    ap.add_argument("--history-rounds", type=int, default=3,
                    help="point 2: pairs of drains (without, with history) taking turns; medians compared [3]")
    ap.add_argument("--soak-minutes", type=float, default=30)
    ap.add_argument("--soak-rate", type=int, default=0, help="events/s; 0: 40 %% of point 1's small drain [0]")
    ap.add_argument("--soak-modes", default="mark,delete")
    ap.add_argument("--writers-alone-seconds", type=float, default=60,
                    help="before the soaks, the writers with no relay for this long (0 skips) [60]")
    ap.add_argument("--events-per-txn", type=int, default=10, help="events per writer transaction in points 3 and 4 [10]")
    ap.add_argument("--retention", default="2m")
    ap.add_argument("--catchup-backlog", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--drain-timeout", type=float, default=900, help="seconds for one drain or catch-up [900]")
    ap.add_argument("--plot-dir", default=str(pc.ROOT / "bench" / "figures"),
                    help="where the PNG plots go [bench/figures/]")
    ap.add_argument("--relay-config-extra", default="", help="YAML merged into the relay: section")
    ap.add_argument("--writers-async-commit", action="store_true",
                    help="the writers' sessions with synchronous_commit off, not the probe's (a diagnosis: how "
                         "much of the tail is the writers' commits waiting for the WAL flush, which hold back "
                         "every event above their ids)")
    ap.add_argument("--no-sink-fsync", action="store_true",
                    help="the file sink without fsync (a diagnosis: how much of the latency is the sink's fdatasync)")
    ap.add_argument("--max-wal-size", default="8GB",
                    help="the cluster's max_wal_size [8GB]: at the soak's write rates PostgreSQL's default (1GB) "
                         "makes a checkpoint every ~30 s and logs 'checkpoints are occurring too frequently'; "
                         "'default' keeps it")
    ap.add_argument("--pg-settings", default=RECOMMENDED_PG_SETTINGS, metavar="NAME=VALUE,...",
                    help=f"server settings for the soak's cluster (ALTER SYSTEM SET), recorded in the JSON "
                         f"[{RECOMMENDED_PG_SETTINGS}: the advice of docs/performance.md for high steady rates; 'none' keeps "
                         f"PostgreSQL's defaults]")
    ap.add_argument("--table-sql", metavar="FILE",
                    help="SQL run once after the migration, before any point (an experiment on the table, e.g. "
                         "bench/experiments/hot-marks.sql; its text is recorded in the JSON)")
    a = ap.parse_args()
    pc.terminate_on_signals()
    points = {int(x) for x in a.points.split(",") if x.strip()}
    a.url = pc.bench_database_url()
    binary = pc.snapshot_binary(a.relay_bin, Path(a.work) / "bin", a.wait_for_bin, TAG)
    log(f"migrating outbox_events with {binary['path']}")
    pc.migrate(binary["copy"], pc.Db(a.url, a.pg_dir).relay_env())
    s = Soak(a, binary["copy"])
    table_sql = Path(a.table_sql).read_text() if a.table_sql else None
    if table_sql:
        log(f"running {a.table_sql} on the migrated table")
        s.db.psql(table_sql)
    if a.max_wal_size != "default":
        s.db.psql(f"ALTER SYSTEM SET max_wal_size = '{a.max_wal_size}'", "SELECT pg_reload_conf()")
        time.sleep(0.5)
    # Each autovacuum run in the server's log, with its duration and what it did (the tail's
    # windows are compared with them).
    chosen = [] if a.pg_settings == "none" else [x.strip() for x in a.pg_settings.split(",") if x.strip()]
    settings = ["log_autovacuum_min_duration=0"] + chosen
    for setting in settings:
        name, _, value = setting.partition("=")
        if not re.fullmatch(r"[a-z_]+", name) or not value:
            ap.error(f"--pg-settings: expected NAME=VALUE, got {setting!r}")
        s.db.psql(f"ALTER SYSTEM SET {name} = '{value}'")
    s.db.psql("SELECT pg_reload_conf()")
    time.sleep(0.5)
    doc = {"meta": pc.base_meta(s.db), "binary": binary, "config": {k: v for k, v in vars(a).items() if k != "url"}}
    doc["meta"]["schema_versions"] = s.db.schema_versions()
    if table_sql:
        doc["meta"]["table_sql"] = table_sql
    doc["meta"]["max_wal_size"] = s.db.psql("SHOW max_wal_size")
    doc["meta"]["pg_settings"] = {n.partition("=")[0]: s.db.psql(f"SHOW {n.partition('=')[0]}") for n in settings}
    doc["meta"]["checkpoint_timeout"] = s.db.psql("SHOW checkpoint_timeout")
    if 1 in points or (not a.soak_rate and points & {3, 4}):
        doc["backlog"] = s.backlog()
    if not a.soak_rate and points & {3, 4}:
        # 40 % of the relay's drain rate on this machine: the quiet drain, or, when writers and the
        # relay cannot both run at that rate on this machine, the relay's rate beside unpaced writers.
        doc["sustained"] = s.sustained()
        quiet = doc["backlog"]["small"]["events_per_s"]
        base = min(quiet, doc["sustained"]["relay_events_per_s"])
        a.soak_rate = int(round(0.4 * base, -2))
        doc["config"]["soak_rate"] = a.soak_rate
        log(f"soak rate: 40 % of {base:,.0f}/s (quiet drain {quiet:,.0f}/s, beside unpaced writers "
            f"{doc['sustained']['relay_events_per_s']:,.0f}/s) = {a.soak_rate:,}/s")
    if 2 in points:
        doc["history"] = s.history()
    if 3 in points and a.writers_alone_seconds > 0:
        doc["writers_alone"] = s.writers_alone(a.writers_alone_seconds)
    if 3 in points:
        doc["soak"] = {m: s.soak(m) for m in a.soak_modes.split(",") if m}
    if 4 in points:
        doc["catchup"] = s.catchup()
    doc["meta"]["finished_at"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    pc.write_json(doc, Path(a.out), "soak-latest.json")
    doc["plots"] = plot(doc, Path(a.plot_dir))
    pc.write_json(doc, Path(a.out), "soak-latest.json")
    print_report(doc, a)
    print(f"\nresult file: {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"[{TAG}] interrupted ({e}); relay and writers stopped", file=sys.stderr)
        sys.exit(130)
