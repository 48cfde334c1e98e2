#!/usr/bin/env python3
"""Steady-stream, bursty and idle cost of the relay (issue 9, acceptance 2 and 3), on a cluster
that bench/steady.sh started. outbox_events is migrated by the binary under test (its newest
schema); the relay runs with a file sink (fsync) in the scratch directory, batch_size 500, its
HTTP listener on a free local port (for /readyz and /metrics), DATABASE_URL in its environment,
and --relay-config-extra merged into its relay: section.

a) Paced writers: pgbench -n -M prepared -R RATE -c 8 -j 2, single-row INSERT into
   outbox_events, for --seconds, per rate: first with no relay (baseline), then with a relay that
   was started and idle for --settle-seconds before the writers. The CPU window starts with the
   writers and ends when both the writers have exited (+0.1 s, so the postmaster has reaped
   their backends) and the last event is in the sink file. CPU from /proc (bench/pgcost.py):
   the relay process's utime+stime, and Postgres = every process of this cluster, utime+stime+
   cutime+cstime. Per event: relay CPU / events, and (Postgres CPU with the relay - Postgres CPU
   of the baseline, scaled to the same number of events) / events. Targets: 1,000/s <= 100 us,
   5,000/s <= 50 us (relay + Postgres). Events per claim from /metrics: events published /
   outbox_relay_claim_duration_seconds_count (every claim statement, also the ones that found
   nothing). Not in the window: the completion of the last batch (it follows the sink's write).
   Postgres CPU is also split by process (the relay's sessions by application_name, walwriter,
   ..., and "exited": backends and autovacuum workers that ended in the window) in the log and
   the JSON, for a diagnosis.
b) Commit-to-sink latency during (a): a tailer thread reads the sink file as it grows (inotify)
   and stamps each line with time.time(). Commit-to-sink = stamp - when the writer's COMMIT
   returned: each writer puts pgbench's :client_id into its order ids, and a client's k-th row in
   id order is its k-th transaction in pgbench's log (-l), whose completion time that is. The
   commit is visible to the relay a moment (the reply's trip) before it returns, so the figure
   understates by that much. Also reported: INSERT-to-sink, stamp - the row's created_at
   (clock_timestamp() at INSERT, before the commit's WAL flush): it overstates commit-to-sink by
   the flush. A line counts when it is in the file, before the sink's fdatasync. Same machine,
   same clock. p50/p99/max per rate; target p99 <= 10 ms (commit-to-sink).
c) Bursty: a relay with sweep_interval 1h; for --burst-seconds, one psql session writes bursts
   of 1..50 events (random), each burst either as separate single-row transactions or as one
   multi-row INSERT (random), separated by idle gaps of 0..300 ms (random). Every event must
   reach the sink within 100 ms of its created_at (target: 0 over 100 ms), and every id must
   arrive exactly once.
d) Idle: no writes for --idle-seconds, first with no relay (baseline), then with a relay that has
   run for --settle-seconds: relay CPU + (Postgres CPU - baseline) as % of one core; target <= 1 %.
e) Wakeup latency of the existing bench (bench/tool latency, as bench/run.sh runs it): an idle
   relay, single-row inserts at 200/s, commit returned -> line in the sink; target p99 <= 10 ms.
   Skipped if outbox-bench is missing or with --wakeup-count 0.

Standard library only; prints a markdown table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pgcost as pc  # noqa: E402

TAG = "steady"
TARGET_US = {1000: 100.0, 5000: 50.0}  # DESIGN section 9 / issue 9


def log(msg):
    pc.log(TAG, msg)


class Steady:
    def __init__(self, a, relay_bin):
        self.a = a
        self.relay_bin = relay_bin
        self.work = Path(a.work)
        self.db = pc.Db(a.url, a.pg_dir)

    def setup(self):
        log("migrating outbox_events (newest schema)")
        pc.migrate(self.relay_bin, self.db.relay_env())
        # Calls and time of the claim and reading functions per run (pg_stat_user_functions).
        self.db.psql("ALTER SYSTEM SET track_functions = 'pl'", "SELECT pg_reload_conf()")
        self.script = pc.insert_script(self.work / "insert.sql", "outbox_events", tag_client=True)
        return {"schema_versions": self.db.schema_versions(), "triggers": self.db.triggers("outbox_events")}

    def function_stats(self):
        """{name: (calls, self ms)} of the outbox functions, as the statistics show them now."""
        out = {}
        for line in self.db.psql("SELECT funcname || '|' || calls || '|' || self_time FROM pg_stat_user_functions "
                                 "WHERE funcname LIKE 'outbox%'").splitlines():
            name, calls, ms = line.split("|")
            out[name] = (int(calls), float(ms))
        return out

    def reset(self):
        self.db.psql("TRUNCATE outbox_events RESTART IDENTITY", "CHECKPOINT")
        time.sleep(0.3)

    # -- the relay ------------------------------------------------------------------------------
    def relay_options(self, **over):
        opts = {"batch_size": self.a.batch_size}
        opts.update(over)
        return opts

    def start_relay(self, name, http=True, pinned=(), **relay_opts):
        """Config, empty sink file, tailer, relay; waits until /readyz says ready."""
        sink = self.work / f"{name}-sink.jsonl"
        sink.unlink(missing_ok=True)
        port = pc.free_port() if http else None
        cfg = pc.write_relay_config(self.work / f"{name}.yaml", sink, port, self.relay_options(**relay_opts),
                                    self.a.relay_config_extra, pinned=pinned, tracing=self.a.relay_tracing)
        tailer = pc.Tailer(sink)
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
        return code

    def wait_none_pending(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            n = self.db.pending()
            if n == 0 or time.monotonic() > deadline:
                return n
            time.sleep(0.1)

    def db_ids(self):
        return [int(x) for x in self.db.psql("SELECT id FROM outbox_events ORDER BY id").split()]

    def delivery(self, tailer, events):
        """Exactly once, from the whole sink file read again after the relay stopped (the tailer's
        lines must be the same), and the table's ids. Rows of missing ids, for a diagnosis."""
        file_ids = [json.loads(l)["id"] for l in tailer.path.read_bytes().splitlines() if l.strip()]
        d = pc.exactly_once(file_ids, self.db_ids())
        d["tailer_lines"] = len(events)
        d["tailer_consistent"] = len(events) == len(file_ids)
        if not d["tailer_consistent"]:
            d["ok"] = False
        if d["missing"]:
            ids = ",".join(str(i) for i in d["missing_sample"])
            d["missing_rows"] = self.db.psql(
                "SELECT json_agg(t ORDER BY id) FROM (SELECT id, aggregate_id, lane, created_at, processed_at, attempts, "
                f"lease_owner, lease_until, next_attempt_at, last_error FROM outbox_events WHERE id IN ({ids})) t")
        return d

    # -- a) + b) paced writers -------------------------------------------------------------------
    def paced_baseline(self, rate, tag):
        self.reset()
        av0 = self.db.autovacuum_counts()
        log(f"{tag}: {rate}/s, {self.a.clients} writers, {self.a.seconds} s, no relay (baseline)")
        logp = self.work / "pgbench-txn" / "baseline"
        logp.parent.mkdir(exist_ok=True)
        s0 = pc.Snapshot(self.db.postmaster)
        r = pc.pgbench(self.db.env, self.script, self.a.clients, self.a.jobs, self.a.seconds, rate=rate,
                       log_prefix=logp)
        time.sleep(0.1)  # the postmaster reaps the writers' backends
        s1 = pc.Snapshot(self.db.postmaster)
        r["cpu"] = pc.window(s0, s1)
        r["postgres_cpu_by_kind"] = pc.postgres_cpu_by_kind(s0.procs, s1.procs, self.db.app_names())
        r["writer_txn"] = pc.txn_log_summary(logp)
        r["autovacuum_runs"] = self.db.autovacuum_counts() - av0
        log(f"  baseline: {r['processed']:,} events, Postgres {r['cpu']['postgres_cpu_seconds']:.2f} CPU-s, "
            f"foreign load {r['cpu']['foreign_cores']:.2f} cores")
        log(f"  Postgres CPU-s by process: {r['postgres_cpu_by_kind']}")
        if "functions" in r:
            log(f"  functions (calls, self ms): {r['functions']}")
        return r

    def paced_relay(self, rate, tag):
        a = self.a
        self.reset()
        av0 = self.db.autovacuum_counts()
        relay, tailer = self.start_relay(f"steady-{rate}-" + tag.split()[1].replace("/", "of"))
        try:
            time.sleep(a.settle_seconds)
            log(f"{tag}: {rate}/s, {a.clients} writers, {a.seconds} s, relay running")
            m0 = relay.metrics()
            f0 = self.function_stats()
            s0 = pc.Snapshot(self.db.postmaster, relay.pid)
            logp = self.work / "pgbench-txn" / "relay"
            logp.parent.mkdir(exist_ok=True)
            p = pc.pgbench(self.db.env, self.script, a.clients, a.jobs, a.seconds, rate=rate, popen=True,
                           log_prefix=logp)
            try:
                out, err = p.communicate(timeout=a.seconds + 300)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            t_writers = time.monotonic()
            r = pc.parse_pgbench(p.returncode, out, err)
            tailer.set_target(r["processed"])
            drained = tailer.reached.wait(timeout=a.drain_timeout)
            rest = 0.1 - (time.monotonic() - t_writers)
            if rest > 0:
                time.sleep(rest)
            s1 = pc.Snapshot(self.db.postmaster, relay.pid)
            m1 = relay.metrics()
            r["cpu"] = pc.window(s0, s1)
            r["postgres_cpu_by_kind"] = pc.postgres_cpu_by_kind(s0.procs, s1.procs, self.db.app_names())
            r["all_in_sink_in_window"] = drained
            r["last_line_after_writers_s"] = round(tailer.reached_at - t_writers, 4) if drained else None
            r["relay_metrics"] = pc.metrics_delta(m0, m1)
            r["pending_after"] = self.wait_none_pending()
            time.sleep(1.1)  # a backend reports its function statistics at most once a second
            f1 = self.function_stats()
            r["functions"] = {k: {"calls": v[0] - f0.get(k, (0, 0))[0], "self_ms": round(v[1] - f0.get(k, (0, 0))[1], 1)}
                              for k, v in f1.items()}
            time.sleep(0.2)
        finally:
            r_code = self.stop_relay(relay, tailer)
        r["relay_exit_code"] = r_code
        r["autovacuum_runs"] = self.db.autovacuum_counts() - av0
        r["writer_txn"] = pc.txn_log_summary(logp)
        ev = tailer.events()
        r["delivery"] = self.delivery(tailer, ev)
        r["latency"] = pc.latency_summary([(t - c) * 1000 for _, t, c in ev])
        r["latency_samples_ms"] = [round((t - c) * 1000, 3) for _, t, c in ev]
        commits = self.commit_times(logp)
        if commits is not None:
            cs = [round((t - commits[i]) * 1000, 3) for i, t, _ in ev if i in commits]
            r["commit_latency"] = pc.latency_summary(cs)
            r["commit_latency_samples_ms"] = cs
        r["tailer"] = tailer.mode
        log(f"  relay: {r['processed']:,} events, relay {r['cpu']['relay_cpu_seconds']:.2f} CPU-s, Postgres "
            f"{r['cpu']['postgres_cpu_seconds']:.2f} CPU-s, last line {r['last_line_after_writers_s']} s after the "
            f"writers; latency from the INSERT p50 {r['latency']['p50_ms']} p99 {r['latency']['p99_ms']} ms, from the "
            f"COMMIT's return p50 {r.get('commit_latency', {}).get('p50_ms')} p99 {r.get('commit_latency', {}).get('p99_ms')} ms; "
            f"events/claim {r['relay_metrics'].get('events_per_claim')}; foreign load {r['cpu']['foreign_cores']:.2f}")
        log(f"  Postgres CPU-s by process: {r['postgres_cpu_by_kind']}")
        if "functions" in r:
            log(f"  functions (calls, self ms): {r['functions']}")
        return r

    def commit_times(self, logp):
        rows = self.db.psql("SELECT id || ' ' || (payload->>'order_id') FROM outbox_events ORDER BY id")
        return pc.commit_times(logp, [tuple(int(x) for x in r.split()) for r in rows.splitlines() if r])

    def paced(self):
        out = {}
        for rate in self.a.rates:
            rounds = []
            for i in range(self.a.rounds):
                tag = f"round {i + 1}/{self.a.rounds}"
                base = self.paced_baseline(rate, tag)
                rel = self.paced_relay(rate, tag)
                f = per_event(base, rel)
                f["baseline_rate"], ok_b = pace(base, rate, self.a.seconds)
                f["relay_rate"], ok_r = pace(rel, rate, self.a.seconds)
                f["paced_ok"] = ok_b and ok_r
                if not f["paced_ok"]:
                    log(f"  WARNING: the writers reached {f['baseline_rate']}/s (baseline) and {f['relay_rate']}/s "
                        f"(with relay) of {rate}/s: not comparable")
                rounds.append({"baseline": base, "relay": rel, "figures": f})
            out[str(rate)] = rounds
        return out

    # -- c) bursts -------------------------------------------------------------------------------
    def bursty(self):
        a = self.a
        self.reset()
        rnd = random.Random(a.seed)
        relay, tailer = self.start_relay("bursty", pinned=("sweep_interval",), sweep_interval="1h")
        session = pc.PsqlSession(self.db.env, self.work / "bursty-psql.err")
        bursts = {"separate_txns": 0, "multi_row_txn": 0}
        log_bursts = []
        total = 0
        try:
            session.run("SET client_min_messages = warning;")
            time.sleep(a.settle_seconds)
            log(f"bursty: {a.burst_seconds} s of bursts of 1-{a.burst_max} events, gaps 0-{a.gap_max_ms} ms, "
                "sweep_interval 1h")
            m0 = relay.metrics()
            s0 = pc.Snapshot(self.db.postmaster, relay.pid)
            t_end = time.monotonic() + a.burst_seconds
            while time.monotonic() < t_end:
                n = rnd.randint(1, a.burst_max)
                rows = [pc.event_values(str(rnd.randint(1, 1000)), str(total + j + 1)) for j in range(n)]
                ins = "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES "
                multi = rnd.random() >= 0.5
                tb = time.time()
                if not multi:
                    session.run("\n".join(ins + v + ";" for v in rows))
                    bursts["separate_txns"] += 1
                else:
                    session.run(ins + ",\n".join(rows) + ";")
                    bursts["multi_row_txn"] += 1
                # ids are 1.. in writing order: one session, RESTART IDENTITY before
                log_bursts.append({"first_id": total + 1, "events": n, "multi_row": multi,
                                   "started": round(tb, 6), "seconds": round(time.time() - tb, 4)})
                total += n
                time.sleep(rnd.uniform(0, a.gap_max_ms) / 1000)
            t_writers = time.monotonic()
            tailer.set_target(total)
            arrived = tailer.reached.wait(timeout=a.burst_grace)
            s1 = pc.Snapshot(self.db.postmaster, relay.pid)
            m1 = relay.metrics()
            pending = self.wait_none_pending(timeout=1.0)
        finally:
            session.close()
            code = self.stop_relay(relay, tailer)
        ev = tailer.events()
        lat = [(t - c) * 1000 for _, t, c in ev]
        r = {"events": total, "bursts": bursts, "seconds": a.burst_seconds, "all_arrived": arrived,
             "pending_after": pending, "relay_exit_code": code, "cpu": pc.window(s0, s1),
             "last_line_after_writers_s": round(tailer.reached_at - t_writers, 4) if arrived else None,
             "relay_metrics": pc.metrics_delta(m0, m1), "latency": pc.latency_summary(lat),
             "over_100ms": sum(1 for x in lat if x > 100),
             "delivery": self.delivery(tailer, ev), "tailer": tailer.mode, "burst_log": log_bursts}
        missing = set(r["delivery"]["missing_sample"])
        r["bursts_with_missing"] = [b for b in log_bursts
                                    if any(b["first_id"] <= i < b["first_id"] + b["events"] for i in missing)]
        # An event that never arrived waited for longer than 100 ms, too.
        r["late_or_missing"] = r["over_100ms"] + r["delivery"]["missing"]
        r["over_100ms_samples_ms"] = sorted(round(x, 1) for x in lat if x > 100)[:20]
        log(f"  bursty: {total:,} events in {sum(bursts.values())} bursts; p99 {r['latency']['p99_ms']} ms, max "
            f"{r['latency']['max_ms']} ms, over 100 ms {r['over_100ms']}, missing {r['delivery']['missing']}, "
            f"duplicated {r['delivery']['duplicated']}")
        return r

    # -- d) idle ---------------------------------------------------------------------------------
    def idle(self):
        a = self.a
        self.reset()
        time.sleep(1.0)
        log(f"idle: {a.idle_seconds} s with no relay (baseline)")
        s0 = pc.Snapshot(self.db.postmaster)
        time.sleep(a.idle_seconds)
        base = pc.window(s0, pc.Snapshot(self.db.postmaster))
        relay, tailer = self.start_relay("idle")
        try:
            time.sleep(a.settle_seconds)
            log(f"idle: {a.idle_seconds} s with an idle relay")
            m0 = relay.metrics()
            s0 = pc.Snapshot(self.db.postmaster, relay.pid)
            time.sleep(a.idle_seconds)
            s1 = pc.Snapshot(self.db.postmaster, relay.pid)
            m1 = relay.metrics()
        finally:
            code = self.stop_relay(relay, tailer)
        w = pc.window(s0, s1)
        by_kind = pc.postgres_cpu_by_kind(s0.procs, s1.procs, self.db.app_names())
        # Scale the baseline to the relay window's length (both are about --idle-seconds).
        pg_extra = w["postgres_cpu_seconds"] - base["postgres_cpu_seconds"] * w["wall_seconds"] / base["wall_seconds"]
        r = {"baseline": base, "relay": w, "relay_exit_code": code, "relay_metrics": pc.metrics_delta(m0, m1),
             "relay_pct_core": round(100 * w["relay_cpu_seconds"] / w["wall_seconds"], 3),
             "postgres_pct_core": round(100 * pg_extra / w["wall_seconds"], 3), "postgres_cpu_by_kind": by_kind}
        r["total_pct_core"] = round(r["relay_pct_core"] + r["postgres_pct_core"], 3)
        log(f"  idle: relay {r['relay_pct_core']} % + Postgres {r['postgres_pct_core']} % of one core")
        log(f"  Postgres CPU-s by process (relay window): {by_kind}")
        return r

    # -- e) the existing wakeup-latency bench ---------------------------------------------------
    def wakeup(self, bench_bin):
        a = self.a
        self.reset()
        sink = self.work / "wakeup-sink.jsonl"
        cfg = pc.write_relay_config(self.work / "wakeup.yaml", sink, None, self.relay_options(),
                                    a.relay_config_extra, tracing=a.relay_tracing)
        log(f"wakeup latency (outbox-bench latency): {a.wakeup_count} inserts at {a.wakeup_rate:g}/s, idle relay")
        cmd = [bench_bin, "--url", pc.url_without_password(a.url), "latency", "--mode", "relay", "--file", str(sink),
               "--log-file", str(self.work / "wakeup-relay.log"), "--count", str(a.wakeup_count),
               "--rate", str(a.wakeup_rate), "--", self.relay_bin, "run", "--config", str(cfg)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.db.relay_env(),
                           timeout=a.wakeup_count / a.wakeup_rate + 180)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if not lines:
            return {"error": f"outbox-bench latency failed ({p.returncode}): {p.stderr.strip()[-1500:]}"}
        r = json.loads(lines[-1])
        r.pop("samples_ms", None)
        r["exit_code"] = p.returncode
        log(f"  wakeup: p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms, max {r.get('max_ms')} ms")
        return r


def per_event(base, rel):
    """us per event: the relay's CPU, and the Postgres CPU beyond the baseline's (scaled to the
    same number of events: paced runs differ by a few events)."""
    n = rel["processed"]
    if not n or not base["processed"]:
        return {}
    pg_base = base["cpu"]["postgres_cpu_seconds"] * n / base["processed"]
    relay_us = rel["cpu"]["relay_cpu_seconds"] / n * 1e6
    pg_us = (rel["cpu"]["postgres_cpu_seconds"] - pg_base) / n * 1e6
    return {"events": n, "relay_us": round(relay_us, 1), "postgres_us": round(pg_us, 1),
            "total_us": round(relay_us + pg_us, 1),
            "valid": rel["all_in_sink_in_window"] and rel["delivery"]["ok"]}


def pace(r, rate, seconds):
    """Events/s the paced writers reached, and whether that is the asked rate (pgbench -R falls
    behind when the server or the machine cannot keep up; then runs are not comparable)."""
    achieved = r["processed"] / seconds
    return round(achieved), achieved >= 0.95 * rate


def summarize(doc, a):
    s = {"paced": {}, "targets": {}}
    for rate, rounds in doc.get("paced", {}).items():
        figs = [r["figures"] for r in rounds if r["figures"].get("valid")]
        lat = sorted(x for r in rounds for x in r["relay"]["latency_samples_ms"])
        claims = [r["relay"]["relay_metrics"].get("events_per_claim") for r in rounds]
        d = {
            "rounds": len(rounds), "valid_rounds": len(figs),
            "achieved_rate_baseline": [r["figures"].get("baseline_rate") for r in rounds],
            "achieved_rate_relay": [r["figures"].get("relay_rate") for r in rounds],
            "paced_ok": all(r["figures"].get("paced_ok") for r in rounds),
            "relay_us": pc.median([f["relay_us"] for f in figs]),
            "postgres_us": pc.median([f["postgres_us"] for f in figs]),
            "total_us": pc.median([f["total_us"] for f in figs]),
            "total_us_per_round": [r["figures"].get("total_us") for r in rounds],
            "latency": pc.latency_summary(lat),
            "commit_latency": pc.latency_summary(sorted(x for r in rounds
                                                        for x in r["relay"].get("commit_latency_samples_ms", []))),
            "commit_latency_rounds": sum(1 for r in rounds if "commit_latency" in r["relay"]),
            "events_per_claim": pc.median(claims, 2),
            "last_line_after_writers_s": [r["relay"]["last_line_after_writers_s"] for r in rounds],
            "foreign_cores_max": max(max(r["baseline"]["cpu"]["foreign_cores"], r["relay"]["cpu"]["foreign_cores"])
                                     for r in rounds),
            "autovacuum_runs": sum(r["baseline"]["autovacuum_runs"] + r["relay"]["autovacuum_runs"] for r in rounds),
            "delivery_ok": all(r["relay"]["delivery"]["ok"] for r in rounds),
        }
        t = TARGET_US.get(int(rate))
        d["target_us"] = t
        s["paced"][rate] = d
        if t is not None:
            s["targets"][f"{rate}/s: relay + Postgres <= {t:g} us/event"] = \
                None if d["total_us"] is None else d["total_us"] <= t
        cl = d["commit_latency"] if d["commit_latency_rounds"] == len(rounds) else {"p99_ms": None}
        s["targets"][f"{rate}/s: commit-to-sink p99 <= 10 ms"] = None if cl["p99_ms"] is None else cl["p99_ms"] <= 10
    if "bursty" in doc:
        b = doc["bursty"]
        s["targets"]["bursty: every event within 100 ms (none over, none missing)"] = b["late_or_missing"] == 0
        s["targets"]["bursty: every id exactly once"] = b["delivery"]["ok"]
    if "idle" in doc:
        s["targets"]["idle: relay + its Postgres work <= 1 % of a core"] = doc["idle"]["total_pct_core"] <= 1.0
    if doc.get("wakeup") and "p99_ms" in doc["wakeup"]:
        s["targets"][f"wakeup at {a.wakeup_rate:g}/s: p99 <= 10 ms"] = doc["wakeup"]["p99_ms"] <= 10
    return s


def print_report(doc, a):
    s = doc["summary"]
    m = doc["meta"]
    v = doc["setup"]["schema_versions"].get("outbox_events")
    out = [f"## Steady, bursty and idle cost: {doc['binary']['version']} ({doc['binary']['sha256_16']}), "
           f"schema v{v}, git {m['git']}", "",
           f"PostgreSQL {m['postgres']} (fsync {m['postgres_fsync']}, synchronous_commit {m['synchronous_commit']}), "
           f"{m['nproc']} CPUs. Relay: file sink (fsync), batch_size {a.batch_size}"
           + (f", extra config `{a.relay_config_extra}`" if a.relay_config_extra else "")
           + (f", tracing `{a.relay_tracing}`" if a.relay_tracing else "")
           + f"; triggers on outbox_events: {', '.join(doc['setup']['triggers']) or 'none'}.", ""]
    rows = []
    for rate, d in s["paced"].items():
        r = int(rate)
        t = d["target_us"]
        tot = d["total_us"]
        behind = "" if d["paced_ok"] else (f" **(writers reached only {d['achieved_rate_baseline']} / "
                                            f"{d['achieved_rate_relay']} events/s without / with relay)**")
        rows.append([f"steady {r:,}/s ({a.clients} writers, {a.seconds:g} s): relay + its Postgres work per event"
                     + behind,
                     f"{pc.fmt(tot, 1)} us (relay {pc.fmt(d['relay_us'], 1)} + Postgres {pc.fmt(d['postgres_us'], 1)})",
                     f"<= {t:g} us" if t is not None else "-",
                     pc.held(None if t is None or tot is None else tot <= t)])
        lt = d["commit_latency"]
        whole = d["commit_latency_rounds"] == d["rounds"]
        rows.append([f"steady {r:,}/s: commit-to-sink (the writer's COMMIT returned -> line in the sink) "
                     "p50 / p99 / max" + ("" if whole else " **(not every round could match rows to commits)**"),
                     f"{pc.fmt(lt['p50_ms'], 2)} / {pc.fmt(lt['p99_ms'], 2)} / {pc.fmt(lt['max_ms'], 1)} ms",
                     "p99 <= 10 ms", pc.held(None if lt["p99_ms"] is None or not whole else lt["p99_ms"] <= 10)])
        lt = d["latency"]
        rows.append([f"steady {r:,}/s: INSERT-to-sink (the row's created_at -> line; adds the commit's WAL flush)",
                     f"{pc.fmt(lt['p50_ms'], 2)} / {pc.fmt(lt['p99_ms'], 2)} / {pc.fmt(lt['max_ms'], 1)} ms",
                     "-", "-"])
        rows.append([f"steady {r:,}/s: events per claim statement",
                     pc.fmt(d["events_per_claim"], 1), "tens (DESIGN 9)",
                     "-" if d["events_per_claim"] is None else ("info: yes" if d["events_per_claim"] >= 10
                                                                 else "info: no")])
    if "bursty" in doc:
        b = doc["bursty"]
        lt = b["latency"]
        rows.append([f"bursty {a.burst_seconds:g} s, sweep 1h ({b['events']:,} events): p50 / p99 / max",
                     f"{pc.fmt(lt['p50_ms'], 2)} / {pc.fmt(lt['p99_ms'], 2)} / {pc.fmt(lt['max_ms'], 1)} ms", "-", "-"])
        rows.append(["bursty: events over 100 ms (+ never arrived)",
                     f"{b['over_100ms']} (+ {b['delivery']['missing']})", "0", pc.held(b["late_or_missing"] == 0)])
        dl = b["delivery"]
        rows.append(["bursty: every id exactly once",
                     f"{dl['lines_in_sink']:,} lines for {dl['events_in_table']:,} ids; missing {dl['missing']}, "
                     f"duplicated {dl['duplicated']}", "all, once", pc.held(dl["ok"])])
    if "idle" in doc:
        i = doc["idle"]
        rows.append([f"idle {a.idle_seconds:g} s: relay + its Postgres work",
                     f"{i['total_pct_core']:.3f} % of a core (relay {i['relay_pct_core']:.3f} + Postgres "
                     f"{i['postgres_pct_core']:.3f})", "<= 1 %", pc.held(i["total_pct_core"] <= 1.0)])
    if doc.get("wakeup"):
        w = doc["wakeup"]
        if "p99_ms" in w:
            rows.append([f"wakeup latency, idle relay, {a.wakeup_count} inserts at {a.wakeup_rate:g}/s: p50 / p99 / max",
                         f"{pc.fmt(w['p50_ms'], 2)} / {pc.fmt(w['p99_ms'], 2)} / {pc.fmt(w['max_ms'], 1)} ms",
                         "p99 <= 10 ms", pc.held(w["p99_ms"] <= 10)])
        else:
            rows.append(["wakeup latency (outbox-bench)", w.get("error", w.get("skipped", "-"))[:200], "-", "-"])
    out.append(pc.md_table(["measurement", "figure", "target", "held"], rows, ["---", "---:", "---", "---"]))

    if s["paced"]:
        out += ["", "Paced runs in detail (median of rounds; CPU-s per round in the JSON):", ""]
        drows = []
        for rate, rounds in doc["paced"].items():
            for i, r in enumerate(rounds):
                b, rl, f = r["baseline"], r["relay"], r["figures"]
                mm = rl["relay_metrics"]
                drows.append([f"{int(rate):,}/s #{i + 1}", f"{pc.fmt(f.get('baseline_rate'))} / {pc.fmt(f.get('relay_rate'))}",
                              pc.fmt(rl["processed"]),
                              f"{b['cpu']['postgres_cpu_seconds']:.2f}", f"{rl['cpu']['postgres_cpu_seconds']:.2f}",
                              f"{rl['cpu']['relay_cpu_seconds']:.2f}", pc.fmt(f.get("relay_us"), 1),
                              pc.fmt(f.get("postgres_us"), 1), pc.fmt(f.get("total_us"), 1),
                              pc.fmt(mm.get("claims"), 0), pc.fmt(mm.get("events_per_claim"), 1),
                              ", ".join(f"{k} {int(x)}" for k, x in (mm.get("wakeups") or {}).items() if x),
                              pc.fmt(rl["last_line_after_writers_s"], 3),
                              f"{pc.fmt(rl['writer_txn']['p99_ms'], 1)} / {pc.fmt(rl['writer_txn']['max_ms'], 1)}",
                              f"{max(b['cpu']['foreign_cores'], rl['cpu']['foreign_cores']):.2f}"])
        out.append(pc.md_table(["rate", "reached/s (base / relay)", "events", "PG CPU-s baseline", "PG CPU-s with relay", "relay CPU-s",
                                "relay us/ev", "PG us/ev", "total us/ev", "claims", "ev/claim", "wakeups",
                                "last line after writers (s)", "writers' txn p99 / max (ms)", "foreign cores"],
                               drows))
        out.append("(writers' txn: INSERT sent -> COMMIT returned, from pgbench -l, relay runs; a sink latency "
                   "no larger than this is the commit's, not the relay's)")
    if "bursty" in doc and doc["bursty"]["delivery"]["missing"]:
        b = doc["bursty"]
        try:
            rows = json.loads(b["delivery"].get("missing_rows") or "[]")
        except ValueError:
            rows = []
        desc = "; ".join(f"id {x['id']} (processed_at {x['processed_at']}, lease_owner {x['lease_owner']}, "
                         f"attempts {x['attempts']})" for x in rows)
        bl = ", ".join(f"ids {x['first_id']}-{x['first_id'] + x['events'] - 1} "
                       f"({'one multi-row txn' if x['multi_row'] else 'separate txns'})"
                       for x in b["bursts_with_missing"])
        out += ["", f"Bursty: {b['delivery']['missing']} event(s) never reached the sink within {a.burst_grace:g} s "
                f"of the last burst (still pending afterwards: {b['pending_after']}): {desc}. Their bursts: {bl}."]
    fl = [d["foreign_cores_max"] for d in s["paced"].values()]
    for k in ("bursty",):
        if k in doc:
            fl.append(doc[k]["cpu"]["foreign_cores"])
    if "idle" in doc:
        fl += [doc["idle"]["baseline"]["foreign_cores"], doc["idle"]["relay"]["foreign_cores"]]
    if fl:
        mx = max(fl)
        out += ["", f"Foreign load (other work on this machine) during the windows: max {mx:.2f} cores"
                + ("  <- figures with foreign load are suspect" if mx > 0.15 else "")]
    av = sum(d["autovacuum_runs"] for d in s["paced"].values())
    if av:
        out.append(f"Autovacuum/autoanalyze ran {av} time(s) on outbox_events around the paced runs "
                   "(their CPU is in the Postgres figures).")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-dir", required=True, help="the cluster directory of scripts/pg-cluster.sh")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--out", required=True, help="result JSON file")
    ap.add_argument("--relay-bin", default=str(pc.ROOT / "build-bench" / "bin" / "outbox-relay"))
    ap.add_argument("--bench-bin", default=str(pc.ROOT / "build-bench" / "bin" / "outbox-bench"),
                    help="for (e), the wakeup latency of bench/run.sh")
    ap.add_argument("--wait-for-bin", type=float, default=300,
                    help="seconds to wait for a missing or changing relay binary (a rebuild) [300]")
    ap.add_argument("--rates", default="1000,5000", help="paced event rates, comma-separated [1000,5000]")
    ap.add_argument("--seconds", type=float, default=20, help="seconds of paced writing per run [20]")
    ap.add_argument("--rounds", type=int, default=1, help="baseline + relay pairs per rate [1]")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--settle-seconds", type=float, default=3, help="relay idle before a measurement [3]")
    ap.add_argument("--drain-timeout", type=float, default=120)
    ap.add_argument("--burst-seconds", type=float, default=60, help="0 skips (c) [60]")
    ap.add_argument("--burst-max", type=int, default=50)
    ap.add_argument("--gap-max-ms", type=float, default=300)
    ap.add_argument("--burst-grace", type=float, default=10, help="seconds to wait for the last burst's events")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--idle-seconds", type=float, default=60, help="0 skips (d) [60]")
    ap.add_argument("--wakeup-count", type=int, default=1000, help="(e) inserts; 0 skips [1000]")
    ap.add_argument("--wakeup-rate", type=float, default=200)
    ap.add_argument("--relay-config-extra", default="",
                    help="YAML merged into the relay: section (its keys replace ours), e.g. 'poll_interval: 5ms', "
                         "'{poll_interval: 5ms, idle_poll_interval: 50ms}' or 'a: 1; b: 2'")
    ap.add_argument("--relay-tracing", default="",
                    help="the relay's tracing: section, as --relay-config-extra, e.g. "
                         "'otlp_endpoint: http://127.0.0.1:4318; root_spans: true' (default: none, tracing off)")
    a = ap.parse_args()
    pc.terminate_on_signals()
    a.rates = [int(x) for x in a.rates.split(",") if x.strip()]
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    a.url = pc.bench_database_url()

    binary = pc.snapshot_binary(a.relay_bin, Path(a.work) / "bin", a.wait_for_bin, TAG)
    st = Steady(a, binary["copy"])
    doc = {"meta": pc.base_meta(st.db), "binary": binary,
           "config": {k: v for k, v in vars(a).items() if k != "url"}}
    doc["setup"] = st.setup()
    if a.rates:
        doc["paced"] = st.paced()
    if a.burst_seconds > 0:
        doc["bursty"] = st.bursty()
    if a.idle_seconds > 0:
        doc["idle"] = st.idle()
    if a.wakeup_count > 0:
        if Path(a.bench_bin).exists():
            bench = pc.snapshot_binary(a.bench_bin, Path(a.work) / "bin", 60, TAG, version_check=False)
            doc["wakeup"] = st.wakeup(bench["copy"])
            doc["wakeup"]["binary"] = bench
        else:
            doc["wakeup"] = {"skipped": f"{a.bench_bin} not found (build outbox-bench, or run bench/run.sh)"}
    doc["meta"]["finished_at"] = pc.dt.datetime.now().astimezone().isoformat(timespec="seconds")
    doc["summary"] = summarize(doc, a)
    pc.write_json(doc, Path(a.out), "steady-latest.json")
    print_report(doc, a)
    print(f"\nresult file: {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"[{TAG}] interrupted ({e}); relay and writers stopped", file=sys.stderr)
        sys.exit(130)
