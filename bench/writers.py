#!/usr/bin/env python3
"""Writer cost of the outbox (issue 9, acceptance 1), on a cluster that bench/writers.sh started.

Three tables in one database, measured side by side in one run:
  plain_events   CREATE TABLE ... (LIKE outbox_events INCLUDING ALL) WITH (fillfactor = 50):
                 the same columns, generated lane, defaults, checks and indexes, no triggers,
                 without the lane mark (schema 5's CHECK; schema 9's lane type, so its lane is
                 a plain smallint) and with an identity id of its own (schema 6's id
                 default takes the statement mark and draws from outbox_events' sequence): its
                 writers pay nothing for the outbox;
  outbox_events  `outbox-relay migrate` with the binary under test (its newest schema);
  prev_events    `outbox-relay --table prev_events migrate --to-version N` (--prev-version: the
                 previous release's schema, 4 by default).
Four pgbench workloads (-n -M prepared, unpaced): 32 and 4 clients, each either a single-row
INSERT transaction or BEGIN; UPDATE orders (one random row of --orders); INSERT the event; COMMIT.
Event: topic, aggregate_id 'k' || 1..1000, ~100 bytes of jsonb payload.

Each round runs every (workload, table) point once; the order of the tables rotates from round to
round (round 1: plain, outbox, prev; round 2: outbox, prev, plain; ...). Before every point, the
same treatment for all: TRUNCATE the three tables (RESTART IDENTITY), VACUUM orders, CHECKPOINT.
Figures: median commits/s of the rounds; ratio = table / plain (of the medians; per-round ratios
in the JSON). Target (DESIGN section 9): outbox_events >= 0.90 x plain for every workload.

Then the 32-writer single-row workload into outbox_events once more with `outbox-relay run`
draining to a file sink at the same time: the writers' commits/s, the pending rows
(processed_at IS NULL AND dead_lettered_at IS NULL) right when the writers stop, and how long
until none are pending (polled every ~20 ms through one psql session).

Standard library only; prints a markdown table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pgcost as pc  # noqa: E402

TAG = "writers"
TABLES = ["plain_events", "outbox_events", "prev_events"]
WORKLOADS = [  # (key, clients-attribute, kind, label)
    ("insert_many", "many", "insert", "{n} writers, single-row INSERT txn"),
    ("update_many", "many", "update", "{n} writers, UPDATE orders + INSERT event txn"),
    ("insert_few", "few", "insert", "{n} writers, single-row INSERT txn"),
    ("update_few", "few", "update", "{n} writers, UPDATE orders + INSERT event txn"),
]


def log(msg):
    pc.log(TAG, msg)


class Writers:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.db = pc.Db(a.url, a.pg_dir)
        self.scripts = {}
        self.clients = {"many": a.clients_many, "few": a.clients_few}

    def setup(self, relay_bin):
        env = self.db.relay_env()
        log(f"migrating outbox_events (newest schema) and prev_events (version {self.a.prev_version})")
        pc.migrate(relay_bin, env)
        pc.migrate(relay_bin, env, table="prev_events", to_version=self.a.prev_version)
        self.db.psql("CREATE TABLE plain_events (LIKE outbox_events INCLUDING ALL) WITH (fillfactor = 50)",
                     "ALTER TABLE plain_events DROP CONSTRAINT IF EXISTS outbox_events_lane_mark",
                     "ALTER TABLE plain_events ALTER COLUMN lane TYPE smallint",
                     "DO $$ BEGIN IF (SELECT attidentity FROM pg_attribute WHERE attrelid = 'plain_events'::regclass "
                     "AND attname = 'id') = '' THEN ALTER TABLE plain_events ALTER COLUMN id DROP DEFAULT; "
                     "ALTER TABLE plain_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY; END IF; END $$",
                     "CREATE TABLE orders (id int PRIMARY KEY, amount bigint NOT NULL, "
                     "updated_at timestamptz NOT NULL DEFAULT now())",
                     f"INSERT INTO orders (id, amount) SELECT g, 1000 FROM generate_series(1, {self.a.orders}) g",
                     "VACUUM ANALYZE orders")
        for t in TABLES:
            self.scripts[("insert", t)] = pc.insert_script(self.work / f"insert-{t}.sql", t)
            self.scripts[("update", t)] = pc.update_insert_script(self.work / f"update-{t}.sql", t, self.a.orders)
        versions = self.db.schema_versions()
        info = {"schema_versions": versions,
                "triggers": {t: self.db.triggers(t) for t in TABLES},
                "indexes": {t: self.db.psql(f"SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes "
                                            f"WHERE tablename = '{t}'").split(",") for t in TABLES},
                "payload_bytes": int(self.db.psql(
                    "SELECT octet_length((" + pc.payload_expr("1234567") + ")::text)"))}
        if versions.get("outbox_events") == versions.get("prev_events"):
            log(f"note: the binary's newest schema is version {versions.get('outbox_events')}, "
                "the same as prev_events: both columns measure the same schema")
        return info

    def reset(self):
        self.db.psql("TRUNCATE plain_events, outbox_events, prev_events RESTART IDENTITY", "VACUUM orders",
                     "CHECKPOINT")
        time.sleep(0.2)

    def point(self, kind, clients, table, seconds):
        self.reset()
        s0 = pc.Snapshot(self.db.postmaster)
        r = pc.pgbench(self.db.env, self.scripts[(kind, table)], clients, self.a.jobs, seconds)
        time.sleep(0.1)  # let the postmaster reap the backends
        r["cpu"] = pc.window(s0, pc.Snapshot(self.db.postmaster))
        return r

    def rounds(self):
        out = []
        if self.a.warmup_seconds > 0:
            log(f"warm-up: {self.a.warmup_seconds} s of each kind into plain_events (not measured)")
            for kind in ("update", "insert"):
                self.point(kind, self.a.clients_many, "plain_events", self.a.warmup_seconds)
        for i in range(self.a.rounds):
            k = i % len(TABLES)
            order = TABLES[k:] + TABLES[:k]
            rnd = {"round": i + 1, "order": order, "points": {}}
            for key, which, kind, _ in WORKLOADS:
                n = self.clients[which]
                pts = {}
                for t in order:
                    r = self.point(kind, n, t, self.a.seconds)
                    pts[t] = r
                    log(f"round {i + 1}/{self.a.rounds} {key} ({n} clients) {t}: {r['tps']:,.0f} commits/s"
                        f" (foreign load {r['cpu']['foreign_cores']:.2f} cores)")
                rnd["points"][key] = pts
            out.append(rnd)
        return out

    def with_relay(self, relay_bin):
        """32 single-row writers into outbox_events while the relay drains to a file sink."""
        a = self.a
        self.reset()
        sink = self.work / "writers-sink.jsonl"
        sink.unlink(missing_ok=True)
        port = pc.free_port()
        cfg = pc.write_relay_config(self.work / "writers-relay.yaml", sink, port,
                                    {"batch_size": a.batch_size}, a.relay_config_extra)
        relay = pc.Relay(relay_bin, cfg, self.db.relay_env(), self.work / "writers-relay.log", port)
        session = pc.PsqlSession(self.db.env, self.work / "writers-psql.err")
        try:
            relay.wait_ready()
            time.sleep(1.0)
            m0 = relay.metrics()
            s0 = pc.Snapshot(self.db.postmaster, relay.pid)
            log(f"with relay: {a.clients_many} writers, single-row INSERT into outbox_events, {a.relay_seconds} s")
            r = pc.pgbench(self.db.env, self.scripts[("insert", "outbox_events")], a.clients_many, a.jobs,
                           a.relay_seconds)
            t_end = time.monotonic()
            pending_sql = ("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL "
                           "AND dead_lettered_at IS NULL")
            pending_at_end = int(session.run(pending_sql + ";")[0])
            s1 = pc.Snapshot(self.db.postmaster, relay.pid)
            caught_up, pending, polls = None, pending_at_end, 0
            deadline = t_end + a.drain_timeout
            while pending > 0 and time.monotonic() < deadline and relay.alive():
                time.sleep(0.02)
                pending = int(session.run(pending_sql + ";")[0])
                polls += 1
            if pending == 0:
                caught_up = time.monotonic() - t_end if pending_at_end > 0 else 0.0
            m1 = relay.metrics()
            total = int(session.run("SELECT count(*) FROM outbox_events;")[0])
        finally:
            session.close()
            code = relay.stop()
        lines = sum(1 for _ in open(sink, "rb")) if sink.exists() else 0
        r.update({
            "pending_at_writers_end": pending_at_end,
            "caught_up_seconds_after_writers_end": round(caught_up, 3) if caught_up is not None else None,
            "pending_at_give_up": pending if caught_up is None else 0,
            "events_written": total, "sink_lines": lines, "relay_exit_code": code,
            "cpu_during_writers": pc.window(s0, s1),
            "relay_metrics": pc.metrics_delta(m0, m1),
        })
        log(f"with relay: {r['tps']:,.0f} commits/s; pending at the writers' end {pending_at_end}, "
            f"none pending after {r['caught_up_seconds_after_writers_end']} s; sink lines {lines} of {total}")
        return r


def summarize(doc, a):
    rounds = doc["rounds"]
    s = {"workloads": {}}
    for key, which, kind, label in WORKLOADS:
        n = a.clients_many if which == "many" else a.clients_few
        w = {"label": label.format(n=n), "clients": n, "kind": kind}
        for t in TABLES:
            xs = [r["points"][key][t]["tps"] for r in rounds]
            w[t] = {"tps": xs, "median": pc.median(xs)}
        for t in ("outbox_events", "prev_events"):
            per_round = [round(r["points"][key][t]["tps"] / r["points"][key]["plain_events"]["tps"], 3)
                         for r in rounds]
            w[f"{t}_ratio"] = round(w[t]["median"] / w["plain_events"]["median"], 3) if w["plain_events"]["median"] else None
            w[f"{t}_ratio_per_round"] = per_round
        w["target_held"] = None if w["outbox_events_ratio"] is None else w["outbox_events_ratio"] >= a.target
        s["workloads"][key] = w
    s["all_targets_held"] = all(w["target_held"] for w in s["workloads"].values())
    fl = [p["cpu"]["foreign_cores"] for r in rounds for pts in r["points"].values() for p in pts.values()]
    s["foreign_cores_max"] = max(fl) if fl else None
    if doc.get("with_relay"):
        wr = doc["with_relay"]
        base = s["workloads"]["insert_many"]
        wr["ratio_to_outbox_without_relay"] = round(wr["tps"] / base["outbox_events"]["median"], 3)
        wr["ratio_to_plain"] = round(wr["tps"] / base["plain_events"]["median"], 3)
        wr["relay_kept_up"] = wr["caught_up_seconds_after_writers_end"] is not None and \
            wr["caught_up_seconds_after_writers_end"] <= a.keep_up_seconds
    return s


def print_report(doc, a):
    s = doc["summary"]
    v = doc["setup"]["schema_versions"]
    m = doc["meta"]
    out = [f"## Writer cost: {doc['binary']['version']} ({doc['binary']['sha256_16']}), git {m['git']}",
           "",
           f"PostgreSQL {m['postgres']} (fsync {m['postgres_fsync']}, synchronous_commit {m['synchronous_commit']}), "
           f"{m['nproc']} CPUs; pgbench -n -M prepared -j {a.jobs}, {a.seconds} s per point, {a.rounds} round(s) "
           f"(table order rotating), median commits/s; ratio = table / no-trigger table.",
           f"Triggers: outbox_events (schema v{v.get('outbox_events')}): "
           f"{', '.join(doc['setup']['triggers']['outbox_events']) or 'none'}; prev_events (v{v.get('prev_events')}): "
           f"{', '.join(doc['setup']['triggers']['prev_events']) or 'none'}; plain_events: "
           f"{', '.join(doc['setup']['triggers']['plain_events']) or 'none'}. "
           f"Payload {doc['setup']['payload_bytes']} bytes.",
           ""]
    rows = []
    for key, w in s["workloads"].items():
        pr = w["outbox_events_ratio_per_round"]
        rng = f" ({min(pr):.2f}-{max(pr):.2f})" if len(pr) > 1 else ""
        rows.append([w["label"], pc.fmt(w["plain_events"]["median"]),
                     pc.fmt(w["outbox_events"]["median"]), f"{w['outbox_events_ratio']:.2f}{rng}",
                     f">= {a.target:.2f}", pc.held(w["target_held"]),
                     pc.fmt(w["prev_events"]["median"]), f"{w['prev_events_ratio']:.2f}"])
    out.append(pc.md_table(["workload", "no triggers", f"outbox v{v.get('outbox_events')} (this version)",
                            "ratio (per-round range)", "target", "held",
                            f"previous v{v.get('prev_events')}", "ratio"], rows))
    wr = doc.get("with_relay")
    if wr:
        out += ["", f"{a.clients_many} writers, single-row INSERT into outbox_events for {a.relay_seconds} s "
                f"with `outbox-relay run` draining (file sink, fsync, batch {a.batch_size}):", ""]
        caught = wr["caught_up_seconds_after_writers_end"]
        mm = wr.get("relay_metrics") or {}
        out.append(pc.md_table(
            ["commits/s", "vs outbox alone", "vs no triggers", "pending when writers stopped",
             "none pending after", "kept up", "events/claim"],
            [[pc.fmt(wr["tps"]), f"{wr['ratio_to_outbox_without_relay']:.2f}", f"{wr['ratio_to_plain']:.2f}",
              pc.fmt(wr["pending_at_writers_end"]),
              f"{caught:.2f} s" if caught is not None else f"not within {a.drain_timeout} s "
              f"({wr['pending_at_give_up']} left)",
              pc.held(wr["relay_kept_up"]), pc.fmt(mm.get("events_per_claim"), 1)]]))
        out.append(f"(kept up = no backlog left {a.keep_up_seconds:g} s after the writers stop; "
                   f"sink lines {wr['sink_lines']:,} of {wr['events_written']:,} events; relay CPU during the "
                   f"writers {wr['cpu_during_writers']['relay_cpu_seconds']} s, wakeups {mm.get('wakeups')}; foreign load "
                   f"{wr['cpu_during_writers']['foreign_cores']:.2f} cores)")
    out += ["", f"Foreign load (other work on this machine) during the points: max {s['foreign_cores_max']:.2f} cores"
            + ("  <- figures with foreign load are suspect" if (s["foreign_cores_max"] or 0) > 0.15 else "")]
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-dir", required=True, help="the cluster directory of scripts/pg-cluster.sh")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--relay-bin", default=str(pc.ROOT / "build-bench" / "bin" / "outbox-relay"))
    ap.add_argument("--wait-for-bin", type=float, default=300,
                    help="seconds to wait for a missing or changing relay binary (a rebuild) [300]")
    ap.add_argument("--out", required=True, help="result JSON file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prev-version", type=int, default=4,
                    help="schema version of prev_events, the previous release's [4]; 1: the NOTIFY trigger")
    ap.add_argument("--seconds", type=float, default=8, help="seconds per point [8]")
    ap.add_argument("--clients-many", type=int, default=32)
    ap.add_argument("--clients-few", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2, help="pgbench threads [2]")
    ap.add_argument("--orders", type=int, default=10_000, help="rows of the orders table [10000]")
    ap.add_argument("--warmup-seconds", type=float, default=2, help="unmeasured warm-up per kind, 0 = none [2]")
    ap.add_argument("--target", type=float, default=0.90)
    ap.add_argument("--no-relay", action="store_true", help="skip the run with a relay draining")
    ap.add_argument("--relay-seconds", type=float, default=None, help="writers' seconds with the relay [--seconds]")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--relay-config-extra", default="",
                    help="YAML merged into the relay: section, e.g. 'poll_interval: 5ms' or '{a: 1, b: 2}'")
    ap.add_argument("--drain-timeout", type=float, default=300, help="give up waiting for no pending rows [300]")
    ap.add_argument("--keep-up-seconds", type=float, default=1.0,
                    help="'kept up' = nothing pending within this many seconds of the writers' end [1]")
    a = ap.parse_args()
    pc.terminate_on_signals()
    a.relay_seconds = a.relay_seconds or a.seconds
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")

    a.url = pc.bench_database_url()
    w = Writers(a)
    binary = pc.snapshot_binary(a.relay_bin, Path(a.work) / "bin", a.wait_for_bin, TAG)
    relay_bin = binary["copy"]
    doc = {"meta": pc.base_meta(w.db), "binary": binary,
           "config": {k: v for k, v in vars(a).items() if k not in ("url",)}}
    doc["setup"] = w.setup(relay_bin)
    doc["rounds"] = w.rounds()
    if not a.no_relay:
        doc["with_relay"] = w.with_relay(relay_bin)
    doc["meta"]["finished_at"] = pc.dt.datetime.now().astimezone().isoformat(timespec="seconds")
    doc["summary"] = summarize(doc, a)
    pc.write_json(doc, Path(a.out), "writers-latest.json")
    print_report(doc, a)
    print(f"\nresult file: {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"[{TAG}] interrupted ({e}); relay and writers stopped", file=sys.stderr)
        sys.exit(130)
