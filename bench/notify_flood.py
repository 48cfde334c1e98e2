#!/usr/bin/env python3
"""What a NOTIFY flood from a writer costs the relay and Postgres (issue 43 item 5: any role may
NOTIFY outbox_wakeup), on a cluster that bench/notify_flood.sh started.

The first --relay-bin migrates outbox_events; the flooder is one psycopg session (autocommit off)
of a login role in outbox_writer. Each round runs every binary in turn (order rotating):
`outbox-relay run`, file sink, default relay settings, HTTP on a free port; once it logged
"ordering lanes rebalanced" and idled --settle-seconds, two windows of --seconds: "quiet" (nothing
happens) and "flood": every 10 ms (below 100/s: every 1/rate s) one transaction of rate/100
pg_notify('outbox_wakeup', ...) calls with distinct payloads (Postgres folds equal ones within a
transaction), scheduled on the monotonic clock (a late one goes at once); the NOTIFYs sent are
counted. Per window (bench/pgcost.py): CPU of the relay process, of Postgres by kind (the relay's
sessions by application_name, the flooder's backend by pid, the rest), of the machine and of other
work on it (foreign), as % of one core; the relay's outbox_relay_wakeups_total by source. The relay
stops (SIGTERM) after its windows; no events are written. Acceptance: the flood costs the relay
and its sessions nothing beyond the quiet window.

Needs psycopg (BENCH_PYTHON=~/.cache/outbox-relay/venv/bin/python); prints a markdown table per
binary and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import secrets
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pgcost as pc  # noqa: E402

try:
    import psycopg
    from psycopg import sql
except ImportError:
    raise SystemExit("notify_flood.py needs psycopg: BENCH_PYTHON=~/.cache/outbox-relay/venv/bin/python "
                     "(scripts/test.sh makes that venv)")

TAG = "notify_flood"
FLOODER_ROLE = "notify_flooder"
TXN_PERIOD = 0.010  # seconds between the flooder's transactions at rates of 100/s and more
PCT_COLUMNS = {"relay": "relay %", "pg_relay_sessions": "PG: relay's sessions %",
               "pg_flooder": "PG: flooder's backend %", "pg_rest": "PG: rest %", "machine": "machine %",
               "foreign": "foreign %"}


def log(msg):
    pc.log(TAG, msg)


class Flooder(threading.Thread):
    """Sends `rate` NOTIFYs/s on `conn` for `seconds` (or until halt()); the connection is used by
    this thread only while it runs. An error ends the thread and is kept in `error`."""

    def __init__(self, conn, rate: int, seconds: float):
        super().__init__(daemon=True)
        self.conn, self.seconds = conn, seconds
        self.per_txn = max(1, round(rate * TXN_PERIOD))
        self.period = self.per_txn / rate
        self.sent, self.elapsed, self.error = 0, 0.0, None
        self._halt = threading.Event()

    def run(self):
        t0 = time.monotonic()
        try:
            k = 0
            while not self._halt.is_set() and k * self.period < self.seconds:
                delay = t0 + k * self.period - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.conn.execute("SELECT pg_notify('outbox_wakeup', 'x' || g) FROM generate_series(1, %s) g",
                                  (self.per_txn,))
                self.conn.commit()
                self.sent += self.per_txn
                k += 1
        except Exception as e:  # noqa: BLE001 - raised again by the caller
            self.error = e
        self.elapsed = time.monotonic() - t0

    def halt(self):
        self._halt.set()
        self.join(timeout=10)


class NotifyFlood:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.db = pc.Db(a.url, a.pg_dir)

    def connect_flooder(self):
        """A login role in outbox_writer with a fresh password (kept in this process) and its session."""
        password = secrets.token_hex(12)
        with psycopg.connect(self.a.url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE outbox_writer").format(
                sql.Identifier(FLOODER_ROLE), sql.Literal(password)))
        conn = psycopg.connect(self.a.url, user=FLOODER_ROLE, password=password, application_name="notify flooder")
        self.flooder_pid, role, superuser = conn.execute(
            "SELECT pg_backend_pid(), rolname, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        conn.commit()
        log(f"flooder: backend {self.flooder_pid}, role {role} (superuser: {superuser})")
        return conn

    def start_relay(self, binary: dict, name: str) -> pc.Relay:
        port = pc.free_port()
        cfg = pc.write_relay_config(self.work / f"{name}.yaml", self.work / f"{name}-sink.jsonl", port, {})
        relay = pc.Relay(binary["copy"], cfg, self.db.relay_env(), self.work / f"{name}.log", port)
        try:
            relay.wait_ready()
            deadline = time.monotonic() + 60
            while "ordering lanes rebalanced" not in relay.log_path.read_text(errors="replace"):
                if not relay.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"relay did not log 'ordering lanes rebalanced':\n{relay.log_tail()}")
                time.sleep(0.1)
            time.sleep(self.a.settle_seconds)
        except BaseException:
            relay.stop()
            raise
        return relay

    def window(self, relay: pc.Relay, name: str, conn) -> dict:
        flooder = Flooder(conn, self.a.rate, self.a.seconds) if name == "flood" else None
        m0, s0 = relay.metrics(), pc.Snapshot(self.db.postmaster, relay.pid)
        try:
            if flooder:
                flooder.start()
                flooder.join()
            else:
                time.sleep(self.a.seconds)
        finally:
            if flooder:
                flooder.halt()
        s1, m1 = pc.Snapshot(self.db.postmaster, relay.pid), relay.metrics()
        if flooder and flooder.error:
            raise RuntimeError(f"flooder failed: {flooder.error!r}")
        if not relay.alive():
            raise RuntimeError(f"relay exited with {relay.p.returncode}:\n{relay.log_tail()}")
        cpu = pc.window(s0, s1)
        by_kind = pc.postgres_cpu_by_kind(s0.procs, s1.procs, self.db.app_names())
        pg_relay = sum(v for k, v in by_kind.items() if k.startswith("outbox-relay"))
        pg_flooder = s1.procs[self.flooder_pid][1] - s0.procs[self.flooder_pid][1]
        seconds = {"relay": cpu["relay_cpu_seconds"], "pg_relay_sessions": pg_relay, "pg_flooder": pg_flooder,
                   "pg_rest": cpu["postgres_cpu_seconds"] - pg_relay - pg_flooder,
                   "machine": cpu["machine_cores"] * cpu["wall_seconds"], "foreign": cpu["foreign_cpu_seconds"]}
        r = {"window": name, "wall_seconds": cpu["wall_seconds"], "notifies_sent": flooder.sent if flooder else 0,
             "notifies_per_second": round(flooder.sent / flooder.elapsed) if flooder else 0,
             # + 0.0: no "-0.00" where the clock ticks' rounding leaves -1e-17
             "pct_of_a_core": {k: round(100 * v / cpu["wall_seconds"], 2) + 0.0 for k, v in seconds.items()},
             "wakeups": {k: int(v) for k, v in (pc.metrics_delta(m0, m1).get("wakeups") or {}).items() if v},
             "cpu": cpu, "postgres_cpu_by_kind": by_kind}
        log(f"  {name}: {r['notifies_per_second']:,} NOTIFYs/s; % of a core {r['pct_of_a_core']}; "
            f"wakeups {r['wakeups']}")
        return r

    def run(self, binaries: list) -> list:
        conn = self.connect_flooder()
        runs = []
        try:
            for i in range(self.a.rounds):
                k = i % len(binaries)
                for b in binaries[k:] + binaries[:k]:
                    log(f"round {i + 1}/{self.a.rounds}: {b['label']}")
                    relay = self.start_relay(b, f"relay-{b['index']}-round-{i + 1}")
                    try:
                        windows = [self.window(relay, w, conn) for w in ("quiet", "flood")]
                    finally:
                        code = relay.stop()
                    runs.append({"binary": b["label"], "round": i + 1, "relay_exit_code": code, "windows": windows})
        finally:
            conn.close()
        return runs


def print_report(doc, a):
    m = doc["meta"]
    out = [f"## NOTIFY flood from a writer role: {a.rate:,} NOTIFYs/s on outbox_wakeup, git {m['git']}", "",
           f"PostgreSQL {m['postgres']}, {m['nproc']} CPUs; {a.seconds:g} s per window, {a.rounds} round(s); "
           f"flooder: role {FLOODER_ROLE} (in outbox_writer); CPU as % of one core."]
    for b in doc["binaries"]:
        rows = []
        for run in (r for r in doc["runs"] if r["binary"] == b["label"]):
            for w in run["windows"]:
                rows.append([w["window"] + (f" #{run['round']}" if a.rounds > 1 else ""), pc.fmt(w["wall_seconds"], 1),
                             pc.fmt(w["notifies_per_second"])]
                            + [pc.fmt(w["pct_of_a_core"][k], 2) for k in PCT_COLUMNS]
                            + [", ".join(f"{k} {v:,}" for k, v in w["wakeups"].items()) or "none"])
        out += ["", f"### {b['label']} ({b['version']}, sha256 {b['sha256_16']})", ""]
        out.append(pc.md_table(["window", "seconds", "NOTIFYs/s sent"] + list(PCT_COLUMNS.values())
                               + ["relay wakeups by source"], rows,
                               ["---"] + ["---:"] * (2 + len(PCT_COLUMNS)) + ["---"]))
    fl = max(w["pct_of_a_core"]["foreign"] for r in doc["runs"] for w in r["windows"])
    out += ["", f"Foreign load (other work on this machine): max {fl:.1f} % of a core"
            + ("  <- figures with foreign load are suspect" if fl > 15 else "")]
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-dir", required=True, help="the cluster directory of scripts/pg-cluster.sh")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--out", required=True, help="result JSON file")
    ap.add_argument("--relay-bin", action="append",
                    help="a binary to measure; repeat to measure several in turn, the first migrates "
                         "[build-bench/bin/outbox-relay]")
    ap.add_argument("--wait-for-bin", type=float, default=300,
                    help="seconds to wait for a missing or changing relay binary (a rebuild) [300]")
    ap.add_argument("--rate", type=int, default=10_000, help="NOTIFYs per second in the flood window [10000]")
    ap.add_argument("--seconds", type=float, default=20, help="seconds per window [20]")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over all binaries, order rotating [1]")
    ap.add_argument("--settle-seconds", type=float, default=3, help="relay idle after its lanes rebalanced [3]")
    a = ap.parse_args()
    pc.terminate_on_signals()
    if a.rounds < 1 or a.rate < 1:
        ap.error("--rounds and --rate must be >= 1")
    a.relay_bin = a.relay_bin or [str(pc.ROOT / "build-bench" / "bin" / "outbox-relay")]
    a.url = pc.bench_database_url()

    binaries = []
    for i, path in enumerate(a.relay_bin):
        b = pc.snapshot_binary(path, Path(a.work) / "bin" / str(i), a.wait_for_bin, TAG)
        binaries.append({**b, "index": i, "label": path})
    nf = NotifyFlood(a)
    log(f"migrating outbox_events with {binaries[0]['label']}")
    pc.migrate(binaries[0]["copy"], nf.db.relay_env())
    doc = {"meta": pc.base_meta(nf.db), "binaries": binaries,
           "config": {k: v for k, v in vars(a).items() if k != "url"}, "schema_versions": nf.db.schema_versions()}
    doc["runs"] = nf.run(binaries)
    doc["meta"]["finished_at"] = pc.dt.datetime.now().astimezone().isoformat(timespec="seconds")
    pc.write_json(doc, Path(a.out), "notify_flood-latest.json")
    print_report(doc, a)
    print(f"\nresult file: {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"[{TAG}] interrupted ({e}); relay and flooder stopped", file=sys.stderr)
        sys.exit(130)
