#!/usr/bin/env python3
"""The rounds of bench/run.sh: drains (relay, SQL-only, graphile-worker), wakeup latency, the
DESIGN section 7 figures and a per-statement breakdown, on one throwaway Postgres cluster that
run.sh started.

Ratios are only ever taken between figures of this one run: the drain rounds run every system
once, in an order that rotates from round to round (round 1: relay, sql, peer; round 2: sql,
peer, relay; ...); the latency rounds alternate relay and peer. Each figure records the CPU that
Postgres, our own processes and the rest of the machine ("foreign load": other work on these 2
cores) used meanwhile, and CPU per event, which moves much less with foreign load than events/s.

Variants (--variants) add side-by-side rows for the relay and its SQL-only rate with a knob
turned: "delete" (on_success: delete), "async" (synchronous_commit=off for the relay's own
sessions, through the URL), or NAME for the binaries of another build given as --alt NAME=DIR
(DIR holds outbox-relay and outbox-bench, e.g. a patched tree's build/bin); knobs combine with
"+": --alt patched=../other/build/bin --variants delete,patched,patched+async.

Standard library only. Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]
ASYNC_OPTION = "options=-c%20synchronous_commit%3Doff"
KNOBS = {"delete", "async"}


# --------------------------------------------------------------------------------------------
# CPU accounting: ours (Postgres, our children) versus the rest of the machine.

def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    return (user + nice + system + irq + softirq + steal) / HZ


def proc_stat(pid: int):
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()  # fields from 3 (state) on


def postgres_cpu_seconds(postmaster: int) -> float:
    """Postmaster + every backend it has reaped (cutime/cstime) + every live backend."""
    f = proc_stat(postmaster)
    total = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            g = proc_stat(int(entry))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if int(g[1]) == postmaster:
            total += int(g[11]) + int(g[12])
    return total / HZ


def children_cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


class CpuWindow:
    """CPU used during a measurement: Postgres, our client side (the measuring tool and what it
    started: relay or peer), and foreign load (everything else on the machine)."""

    def __init__(self, postmaster: int):
        self.postmaster = postmaster

    def __enter__(self):
        time.sleep(0.05)  # let exited backends of the previous step be reaped
        self.t0 = time.monotonic()
        self.m0 = machine_busy_seconds()
        self.p0 = postgres_cpu_seconds(self.postmaster)
        self.c0 = children_cpu_seconds()
        self.load0 = os.getloadavg()[0]
        return self

    def __exit__(self, *exc):
        time.sleep(0.05)
        wall = time.monotonic() - self.t0
        machine = machine_busy_seconds() - self.m0
        pg = postgres_cpu_seconds(self.postmaster) - self.p0
        client = children_cpu_seconds() - self.c0
        foreign = max(0.0, machine - pg - client)
        self.result = {
            "wall_seconds": round(wall, 3),
            "postgres_cpu_seconds": round(pg, 2),
            "client_cpu_seconds": round(client, 2),
            "foreign_cpu_seconds": round(foreign, 2),
            "foreign_cores": round(foreign / wall, 2) if wall > 0 else None,
            "loadavg_1m_before": round(self.load0, 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        }
        return False


# --------------------------------------------------------------------------------------------

def parse_system(name, alts=()):
    """'relay', 'sql', 'peer', or 'relay[patched+async]' / 'sql[delete]' -> (kind, set of knobs)."""
    m = re.fullmatch(r"(relay|sql|peer)(?:\[([a-z0-9_+-]+)\])?", name)
    if not m:
        raise ValueError(f"bad system name {name!r}")
    knobs = set(m.group(2).split("+")) if m.group(2) else set()
    unknown = knobs - KNOBS - set(alts)
    if unknown:
        raise ValueError(f"unknown variant knob(s) {sorted(unknown)}; expected some of {sorted(KNOBS | set(alts))}")
    if len(knobs & set(alts)) > 1:
        raise ValueError(f"{name}: at most one --alt build per variant")
    return m.group(1), knobs


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.postmaster = int((Path(a.pg_dir) / "data" / "postmaster.pid").read_text().split()[0])
        self.env = {**os.environ, "DATABASE_URL": a.url}
        self.log_dir = self.work / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self.alts = {}
        for spec in a.alt or []:
            name, _, d = spec.partition("=")
            if not re.fullmatch(r"[a-z0-9_-]+", name) or name in KNOBS or not d:
                raise SystemExit(f"--alt {spec!r}: expected NAME=DIR with a lower-case NAME other than {sorted(KNOBS)}")
            self.alts[name] = Path(d)
        self.variants = [v for v in (a.variants.split(",") if a.variants else []) if v]
        for v in self.variants:
            parse_system(f"relay[{v}]", self.alts)

    # -- helpers -------------------------------------------------------------------------------
    def bins(self, knobs):
        for name in knobs & set(self.alts):
            return str(self.alts[name] / "outbox-relay"), str(self.alts[name] / "outbox-bench")
        return self.a.relay_bin, self.a.bench_bin

    def url(self, knobs):
        if "async" not in knobs:
            return self.a.url
        return self.a.url + ("&" if "?" in self.a.url else "?") + ASYNC_OPTION

    def tool(self, *args, bench_bin=None, url=None, timeout=900):
        cmd = [bench_bin or self.a.bench_bin, "--url", url or self.a.url, *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if not lines:
            raise RuntimeError(f"{' '.join(args[:1])} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        out = json.loads(lines[-1])
        out["exit_code"] = p.returncode
        return out

    def psql(self, sql, timeout=300):
        return subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", self.a.url, "-c", sql],
                              capture_output=True, text=True, check=True, timeout=timeout).stdout.strip()

    def relay_config(self, name, sink_path, knobs):
        relay = {"batch_size": self.a.batch_size}
        if "delete" in knobs:
            relay["on_success"] = "delete"
        cfg = {
            "database": {"url": self.url(knobs)},
            "relay": relay,
            "http": {"enabled": False},
            "log": {"level": "info"},
            "sinks": [{"name": "bench", "type": "file", "path": str(sink_path), "fsync": True}],
        }
        path = self.work / f"{name}.yaml"
        path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
        return path

    def log(self, msg):
        print(f"[bench {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # -- setup ---------------------------------------------------------------------------------
    def setup(self):
        subprocess.run([self.a.relay_bin, "migrate"], env=self.env, check=True, capture_output=True, timeout=120)
        subprocess.run([self.a.node, str(self.a.peer_dir / "worker.js"), "migrate"], env=self.env, check=True,
                       capture_output=True, timeout=120)

    def calibrate_fsync(self):
        """fdatasync of a 100 KB append (one 500-event batch of the file sink) on the sink's disk."""
        path = self.work / "fsync-calibration"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        times = []
        try:
            for _ in range(100):
                os.write(fd, b"x" * 100_000)
                t = time.perf_counter()
                os.fdatasync(fd)
                times.append((time.perf_counter() - t) * 1000)
        finally:
            os.close(fd)
            path.unlink()
        times.sort()
        return {"fdatasync_100kb_p50_ms": round(times[49], 2), "fdatasync_100kb_p99_ms": round(times[98], 2)}

    # -- drains --------------------------------------------------------------------------------
    def seed(self, kind):
        self.tool("seed", "--target", "peer" if kind == "peer" else "relay", "--count", str(self.a.events))

    def drain_once(self, system, tag, seed=True):
        kind, knobs = parse_system(system, self.alts)
        n = self.a.events
        if seed:
            self.seed(kind)
        relay_bin, bench_bin = self.bins(knobs)
        with CpuWindow(self.postmaster) as w:
            if kind == "peer":
                p = subprocess.run([self.a.node, str(self.a.peer_dir / "worker.js"), "drain", str(n)], env=self.env,
                                   capture_output=True, text=True, timeout=900)
                lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
                if not lines:
                    raise RuntimeError(f"peer drain failed ({p.returncode}): {p.stderr[-2000:]}")
                r = json.loads(lines[-1])
                r["exit_code"] = p.returncode
            elif kind == "relay":
                sink = self.work / "drain-sink.jsonl"
                cfg = self.relay_config("drain", sink, knobs)
                r = self.tool("relay-drain", "--relay-bin", relay_bin, "--config", str(cfg), "--sink-file", str(sink),
                              "--log-file", str(self.log_dir / f"drain-{system}-{tag}.log"), "--expect", str(n),
                              bench_bin=bench_bin)
                sink.unlink(missing_ok=True)
            else:
                r = self.tool("sql-drain", "--variant", "relay", "--expect", str(n), "--batch", str(self.a.batch_size),
                              *(["--delete"] if "delete" in knobs else []), bench_bin=bench_bin, url=self.url(knobs))
        r["cpu"] = w.result
        r["valid"] = r.get("exit_code") == 0 and "rate" in r
        # CPU per event: Postgres, and our side (tool + relay, tool alone, or node).
        r["postgres_us_per_event"] = round(w.result["postgres_cpu_seconds"] / n * 1e6, 1)
        r["client_us_per_event"] = round(w.result["client_cpu_seconds"] / n * 1e6, 1)
        return r

    def drains(self):
        systems = ["relay", "sql", "peer"] + [f"{k}[{v}]" for v in self.variants for k in ("relay", "sql")]
        rounds = []
        for i in range(self.a.rounds):
            k = i % len(systems)
            order = systems[k:] + systems[:k]
            rnd = {"round": i + 1, "order": order}
            for s in order:
                self.log(f"drain round {i + 1}/{self.a.rounds}: {s}")
                rnd[s] = self.drain_once(s, i + 1)
                self.log(f"  {s}: {rnd[s].get('rate')} events/s, foreign load {rnd[s]['cpu']['foreign_cores']} cores")
            rounds.append(rnd)
        return rounds

    # -- latency -------------------------------------------------------------------------------
    def latency_once(self, system, tag):
        kind, knobs = parse_system(system, self.alts)
        relay_bin, bench_bin = self.bins(knobs)
        self.psql("TRUNCATE outbox_events RESTART IDENTITY; TRUNCATE graphile_worker._private_jobs; CHECKPOINT")
        if kind == "relay":
            sink = self.work / "latency-sink.jsonl"
            cfg = self.relay_config("latency", sink, knobs)
            command = [relay_bin, "run", "--config", str(cfg)]
        else:
            sink = self.work / "latency-peer.txt"
            command = [self.a.node, str(self.a.peer_dir / "worker.js"), "latency", str(sink)]
        with CpuWindow(self.postmaster) as w:
            r = self.tool("latency", "--mode", kind, "--file", str(sink),
                          "--log-file", str(self.log_dir / f"latency-{system}-{tag}.log"),
                          "--count", str(self.a.latency_count), "--rate", str(self.a.latency_rate), "--", *command,
                          bench_bin=bench_bin)
        sink.unlink(missing_ok=True)
        r["cpu"] = w.result
        r["valid"] = r.get("exit_code") == 0 and r.get("all_arrived", False)
        return r

    def latencies(self):
        systems = ["relay", "peer"] + [f"relay[{v}]" for v in self.variants]
        rounds = []
        for i in range(self.a.latency_rounds):
            k = i % len(systems)
            order = systems[k:] + systems[:k]
            rnd = {"round": i + 1, "order": order}
            for s in order:
                self.log(f"latency round {i + 1}/{self.a.latency_rounds}: {s}")
                rnd[s] = self.latency_once(s, i + 1)
                self.log(f"  {s}: p50 {rnd[s].get('p50_ms')} ms, p99 {rnd[s].get('p99_ms')} ms, "
                         f"foreign load {rnd[s]['cpu']['foreign_cores']} cores")
            rounds.append(rnd)
        return rounds

    # -- DESIGN section 7 figures (once per run; not alternated) -----------------------------
    def design(self):
        out = {}
        for variant in ["one-txn-mark", "lease-then-mark", "one-txn-delete"]:
            self.log(f"design: SQL-only drain {variant}")
            self.seed("sql")
            with CpuWindow(self.postmaster) as w:
                r = self.tool("sql-drain", "--variant", variant, "--expect", str(self.a.events),
                              "--batch", str(self.a.batch_size))
            r["cpu"] = w.result
            out[f"sql_{variant}"] = r
        out["writers"] = self.writers()
        return out

    def writers(self):
        """Single-row INSERT transactions from 32 pgbench clients: with the shipped triggers, and
        with the NOTIFY trigger, the other triggers, or all of them disabled."""
        script = self.work / "writer.sql"
        script.write_text("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                          "VALUES ('order.paid', 'order-' || (random() * 10000)::int, '{\"amount_cents\": 1999}');\n")
        triggers = self.psql("SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger "
                             "WHERE tgrelid = 'outbox_events'::regclass AND NOT tgisinternal")
        names = [t for t in triggers.split(",") if t]
        notify = [t for t in names if t.endswith("_notify")]
        others = [t for t in names if t not in notify]
        results = {"triggers": triggers}
        variants = [("with_triggers", []), ("without_notify_trigger", notify)]
        if others:
            variants += [("only_notify_trigger", others), ("without_triggers", names)]
        for label, disable in variants:
            self.log(f"design: writers {label}")
            self.psql("TRUNCATE outbox_events RESTART IDENTITY; CHECKPOINT")
            for t in disable:
                self.psql(f"ALTER TABLE outbox_events DISABLE TRIGGER {t}")
            try:
                with CpuWindow(self.postmaster) as w:
                    p = subprocess.run(["pgbench", "-n", "-c", "32", "-j", "2", "-T", str(self.a.writer_seconds),
                                        "-f", str(script), self.a.url], capture_output=True, text=True, timeout=300)
            finally:
                for t in disable:
                    self.psql(f"ALTER TABLE outbox_events ENABLE TRIGGER {t}")
            m = re.search(r"tps = ([0-9.]+)", p.stdout)
            results[label] = {"commits_per_second": float(m.group(1)) if m else None, "cpu": w.result}
        self.psql("TRUNCATE outbox_events RESTART IDENTITY")
        return results

    # -- where the time goes ---------------------------------------------------------------------
    def breakdown(self):
        """One SQL-only drain and one relay drain with every statement's server-side duration
        logged (log_min_duration_statement = 0): what each statement of a batch costs. The
        logging slows these two drains; their rates are not figures."""
        server_log = Path(self.a.pg_dir) / "server.log"
        out = {}
        db = self.a.url.rsplit("/", 1)[1].split("?")[0]
        for system in ["sql", "relay"]:
            self.log(f"breakdown: {system} drain with statement durations logged")
            self.seed(system)
            self.psql(f"ALTER DATABASE {db} SET log_min_duration_statement = 0")  # new sessions
            start = server_log.stat().st_size
            try:
                r = self.drain_once(system, "breakdown", seed=False)
            finally:
                self.psql(f"ALTER DATABASE {db} RESET log_min_duration_statement")
            with open(server_log, errors="replace") as f:
                f.seek(start)
                text = f.read()
            out[system] = {"drain_seconds": r.get("seconds"), "statements": summarize_statement_log(text)}
        return out


STATEMENT_KINDS = [
    ("fence", re.compile(r"execute fence")),
    ("claim", re.compile(r"execute claim")),
    ("complete", re.compile(r"execute complete")),
    ("begin", re.compile(r"statement: BEGIN")),
    ("commit", re.compile(r"statement: COMMIT")),
    ("rebalance", re.compile(r"AS member, objid::int8 FROM pg_locks|pg_try_advisory_lock")),
]


def summarize_statement_log(text):
    acc = {}
    for m in re.finditer(r"duration: ([0-9.]+) ms\s+(.*)", text):
        ms, rest = float(m.group(1)), m.group(2)
        kind = next((k for k, rx in STATEMENT_KINDS if rx.search(rest)), None)
        if kind is None:
            kind = "bind/parse" if ("bind " in rest or "parse " in rest) else "other"
        acc.setdefault(kind, []).append(ms)
    out = {}
    for kind, v in sorted(acc.items(), key=lambda kv: -sum(kv[1])):
        v.sort()
        out[kind] = {"count": len(v), "total_ms": round(sum(v), 1), "mean_ms": round(sum(v) / len(v), 3),
                     "p50_ms": round(v[len(v) // 2], 3), "p99_ms": round(v[min(len(v) - 1, int(len(v) * 0.99))], 3)}
    return out


# --------------------------------------------------------------------------------------------
# Aggregation and the table.

def pct(values, q):
    v = sorted(values)
    if not v:
        return None
    return v[max(1, math.ceil(q * len(v))) - 1]


def median_or_none(values, digits=1):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), digits) if values else None


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def summarize(doc):
    s = {"drain": {}, "latency": {}}
    rounds = doc["drain_rounds"]
    systems = rounds[0]["order"] if rounds else []
    order = {"relay": 0, "sql": 1, "peer": 2}
    variants = doc["config"].get("variants", [])

    def variant_index(x):
        return variants.index(x[x.find("[") + 1:-1]) + 1 if "[" in x else 0
    systems = sorted(systems, key=lambda x: (variant_index(x), order[x.split("[")[0]]))
    for system in systems:
        xs = [r[system] for r in rounds]
        ok = [x for x in xs if x["valid"]]
        s["drain"][system] = {
            "rates": [x.get("rate") for x in xs],
            "rate_median": median_or_none([x["rate"] for x in ok]),
            "postgres_us_per_event_median": median_or_none([x["postgres_us_per_event"] for x in ok]),
            "client_us_per_event_median": median_or_none([x["client_us_per_event"] for x in ok]),
            "foreign_cores": [x["cpu"]["foreign_cores"] for x in xs],
            "failed_rounds": len(xs) - len(ok),
        }

    def pair(a, b):
        per_round = [ratio(r[a]["rate"], r[b]["rate"]) for r in rounds if r[a]["valid"] and r[b]["valid"]]
        return {"of_medians": ratio(s["drain"][a]["rate_median"], s["drain"][b]["rate_median"]),
                "per_round": per_round, "median_per_round": median_or_none(per_round, 3)}

    s["ratios"] = {"relay/sql": pair("relay", "sql"), "relay/peer": pair("relay", "peer")}
    for system in systems:
        if system.startswith("relay["):
            v = system[len("relay["):-1]
            s["ratios"][f"relay[{v}]/sql[{v}]"] = pair(system, f"sql[{v}]")
            s["ratios"][f"relay[{v}]/peer"] = pair(system, "peer")

    lrounds = doc["latency_rounds"]
    for system in (lrounds[0]["order"] if lrounds else []):
        xs = [r[system] for r in lrounds]
        pooled = [v for x in xs if x["valid"] for v in x["samples_ms"]]
        s["latency"][system] = {
            "pooled_p50_ms": pct(pooled, 0.5), "pooled_p99_ms": pct(pooled, 0.99), "pooled_max_ms": pct(pooled, 1.0),
            "p99_per_round_ms": [x.get("p99_ms") for x in xs],
            "acked_p99_per_round_ms": [x.get("acked_p99_ms") for x in xs] if system != "peer" else None,
            "foreign_cores": [x["cpu"]["foreign_cores"] for x in xs],
            "failed_rounds": sum(1 for x in xs if not x["valid"]),
        }
    rel = s["latency"].get("relay", {})

    def check(value, ok):
        return None if value is None else ok(value)
    s["targets"] = {
        "relay >= 0.8 x SQL-only": check(s["ratios"]["relay/sql"]["of_medians"], lambda v: v >= 0.8),
        "relay >= 1.5 x peer": check(s["ratios"]["relay/peer"]["of_medians"], lambda v: v >= 1.5),
        "relay wakeup p99 <= 10 ms": check(rel.get("pooled_p99_ms"), lambda v: v <= 10),
    }
    return s


def fmt(x, digits=0):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}"


LABELS = {"relay": "relay", "sql": "SQL-only", "peer": "graphile-worker"}


def label(system):
    kind = system.split("[")[0]
    return LABELS[kind] + (" " + system[len(kind):] if "[" in system else "")


def print_table(doc):
    s = doc["summary"]
    rounds = doc["drain_rounds"]
    out = []
    add = out.append
    m = doc["meta"]
    add(f"outbox-relay core bench, {m['started_at']}, git {m['git']}")
    add(f"PostgreSQL {m['postgres']} (fsync {m['postgres_fsync']}, synchronous_commit {m['synchronous_commit']}), "
        f"graphile-worker {m['graphile_worker']} on Node {m['node']}, {m['nproc']} CPUs")
    add(f"{doc['config']['events']:,} events, batch {doc['config']['batch_size']}; sink disk fdatasync(100 KB) "
        f"p50/p99 {doc['calibration']['fdatasync_100kb_p50_ms']}/{doc['calibration']['fdatasync_100kb_p99_ms']} ms "
        f"before, {doc['calibration_after']['fdatasync_100kb_p50_ms']}/"
        f"{doc['calibration_after']['fdatasync_100kb_p99_ms']} ms after")
    add("")
    add("Drain: events/s per round (foreign load, cores) | median events/s | CPU us/event median: Postgres + client")
    add("  relay: outbox-relay run, file sink with fdatasync, from start until the last event is marked processed;")
    add("  SQL-only: the relay's own claim + complete statements (its PgStore), no sink; graphile-worker: no-op jobs")
    for system, d in s["drain"].items():
        cells = []
        for r in rounds:
            x = r[system]
            cells.append(f"{fmt(x.get('rate')) if x['valid'] else 'FAILED':>7} ({x['cpu']['foreign_cores']:.1f})")
        add(f"  {label(system):<36}" + " ".join(f"{c:<14}" for c in cells)
            + f"| {fmt(d['rate_median']):>7} | {fmt(d['postgres_us_per_event_median'], 1):>5} + "
              f"{fmt(d['client_us_per_event_median'], 1)}")
    for name, r in s["ratios"].items():
        target = {"relay/sql": "   target >= 0.8", "relay/peer": "   target >= 1.5"}.get(name, "")
        add(f"  {name:<34} = {r['of_medians']} (ratio of medians); per round {r['per_round']}{target}")
    add("")
    add(f"Wakeup latency: {doc['config']['latency_count']} single-row inserts at {doc['config']['latency_rate']:.0f}/s "
        f"per round, commit returned -> event reached the sink (relay: its line is in the file; "
        f"graphile-worker: its task runs)")
    for system, d in s["latency"].items():
        add(f"  {label(system):<36} pooled p50 {fmt(d['pooled_p50_ms'], 2):>6} ms  p99 {fmt(d['pooled_p99_ms'], 2):>6} ms"
            f"  max {fmt(d['pooled_max_ms'], 1):>6} ms | p99 per round {d['p99_per_round_ms']}"
            f" | foreign cores {d['foreign_cores']}")
        if any(x is not None for x in d.get("acked_p99_per_round_ms") or []):
            add(f"  {'':<36} commit -> acked (fsynced, processed_at) p99 per round {d['acked_p99_per_round_ms']}")
    if "design" in doc:
        d = doc["design"]
        add("")
        add("DESIGN section 7 figures (once per run, not alternated)")
        for k in ["sql_one-txn-mark", "sql_lease-then-mark", "sql_one-txn-delete"]:
            if k in d:
                add(f"  SQL-only drain, {k[4:]:<28} {fmt(d[k].get('rate')):>9} rows/s   "
                    f"(foreign load {d[k]['cpu']['foreign_cores']} cores)")
        w = d.get("writers", {})
        add(f"  writers: 32 pgbench clients, single-row INSERT txns (triggers on the table: {w.get('triggers')})")
        for k in ["with_triggers", "without_notify_trigger", "only_notify_trigger", "without_triggers"]:
            if k in w:
                add(f"    {k:<28} {fmt(w[k]['commits_per_second']):>7} commits/s   "
                    f"(foreign load {w[k]['cpu']['foreign_cores']} cores)")
    if "breakdown" in doc:
        add("")
        add("Server-side time per statement kind in one drain (log_min_duration_statement = 0, which slows it)")
        for system, b in doc["breakdown"].items():
            add(f"  {system}: drain {b['drain_seconds']} s")
            for k, v in b["statements"].items():
                if v["total_ms"] >= 50:
                    add(f"    {k:<11} {v['count']:>5} x  mean {v['mean_ms']:>7.3f} ms  p99 {v['p99_ms']:>7.3f} ms"
                        f"  total {v['total_ms'] / 1000:6.2f} s")
    add("")
    for k, v in s["targets"].items():
        add(f"  {'n/a   ' if v is None else 'MET   ' if v else 'MISSED'}  {k}")
    print("\n".join(out))


def git_state():
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "relay", "schema", "CMakeLists.txt")
    return head + (" + uncommitted changes in relay/ or schema/" if dirty else ""), dirty.splitlines()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the benchmark database")
    ap.add_argument("--pg-dir", required=True, help="the cluster directory of scripts/pg-cluster.sh")
    ap.add_argument("--work", required=True, help="scratch directory (sink files, configs, logs)")
    ap.add_argument("--relay-bin", required=True)
    ap.add_argument("--bench-bin", required=True)
    ap.add_argument("--alt", action="append", metavar="NAME=DIR",
                    help="another build's bin/ (outbox-relay + outbox-bench), usable as a variant knob NAME")
    ap.add_argument("--variants", default="", help="comma-separated; knobs joined by '+': delete, async, alt NAMEs")
    ap.add_argument("--node", default="node")
    ap.add_argument("--peer-dir", type=Path, default=ROOT / "bench" / "peer")
    ap.add_argument("--out", required=True, help="result JSON file")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency-rounds", type=int, default=4)
    ap.add_argument("--latency-count", type=int, default=1000)
    ap.add_argument("--latency-rate", type=float, default=200)
    ap.add_argument("--writer-seconds", type=int, default=10)
    ap.add_argument("--no-design", action="store_true", help="skip the DESIGN section 7 figures")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-statement breakdown")
    a = ap.parse_args()

    b = Bench(a)
    git, dirty = git_state()
    doc = {
        "meta": {"started_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"), "git": git,
                 "git_dirty_files": dirty, "nproc": os.cpu_count(),
                 "postgres": b.psql("SHOW server_version"),
                 "postgres_fsync": b.psql("SHOW fsync"), "synchronous_commit": b.psql("SHOW synchronous_commit"),
                 "node": subprocess.run([a.node, "--version"], capture_output=True, text=True).stdout.strip(),
                 "graphile_worker": json.loads((a.peer_dir / "node_modules" / "graphile-worker" / "package.json")
                                               .read_text())["version"],
                 "alts": {k: str(v) for k, v in b.alts.items()}},
        "config": {"events": a.events, "batch_size": a.batch_size, "rounds": a.rounds, "variants": b.variants,
                   "latency_rounds": a.latency_rounds, "latency_count": a.latency_count,
                   "latency_rate": a.latency_rate},
    }
    b.setup()
    doc["calibration"] = b.calibrate_fsync()
    doc["drain_rounds"] = b.drains()
    doc["latency_rounds"] = b.latencies()
    if not a.no_design:
        doc["design"] = b.design()
    if not a.no_breakdown:
        doc["breakdown"] = b.breakdown()
    doc["calibration_after"] = b.calibrate_fsync()
    doc["meta"]["finished_at"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    doc["summary"] = summarize(doc)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print_table(doc)
    print(f"\nresult file: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
