"""Which of the writer marks costs 32 concurrent writers (issue 28): an experiment, not a gate.

    bench/cost-run.sh experiments/writer_marks [--rounds 4 --seconds 8 --clients 32 --relay-bin B]
    bench/cost-run.sh experiments/writer_marks --one-backend 30000 --rounds 10 --tables plain,both,lanetype
    bench/cost-run.sh experiments/writer_marks --one-client 20000 --rounds 10 --tables plain,lanetype,first

Five tables of one database, each migrated or built from outbox_events as the binary under test
migrates it, measured side by side with pgbench (-n -M prepared, single-row INSERT transactions,
unpaced), the order rotating each round; TRUNCATE + CHECKPOINT before every point:
  plain    no mark: an identity id, no lane-mark CHECK
  check    the lane mark only (schema 5's CHECK: one shared advisory lock per lane)
  default  the statement mark only (schema 6's id default: one shared advisory lock per statement)
  both     schema 6 and later: outbox_events itself
  seqlock  plain, plus a read of a second sequence in the id default (a ROW EXCLUSIVE relation
           lock held to the transaction's end, on the fast path: what a mark would cost that is
           not an advisory lock in the shared lock table)
  lanefp   the statement mark as in schema 6, the lane mark as a relation lock instead: nextval of
           one of 64 lane sequences (CACHE 1000: no page touched for most calls) in the CHECK
  stmtfp   the lane mark as in schema 5, the statement mark as nextval of one of 64 bucket
           sequences (start time mod 64) in the id default
  bothfp   both marks as relation locks
  lanetype the statement mark as in schema 6, the lane mark in the lane column's type as schema 9
           puts it: a domain over smallint whose check takes the lane's shared advisory lock
  burn     plain, plus a CHECK that burns ~45 us of CPU per row (md5 of 16.5 kB; a calibration:
           what a known cost does to the ratio)
  first    lanetype, with the statement mark skipped by a statement that began within 100 us of
           its transaction (statement_timestamp() - transaction_timestamp()), so that an
           autocommit single-row INSERT takes the lane mark only: an idea measured and dropped
           (bench/RESULTS.md, "A first statement without a statement mark")
  plain2   a second plain table (with --side-by-side: the noise of the pairing itself)
(--tables picks some of them. --side-by-side: instead of one table at a time, each table runs at
the same time as plain, half the clients each, so both see the same machine; the figure is the
median of the per-round ratios of their commits/s.)
Prints median commits/s and Postgres CPU per transaction, and the ratio to plain.
(--one-backend N: no pgbench; one session per table calls a procedure that inserts N single-row
transactions, one COMMIT each, with synchronous_commit off: the server's own time per transaction,
without the client, the network or the WAL flush. Prints the median and minimum per table. Blind to
`first`: inside a procedure, a transaction begun by COMMIT starts later than the CALL statement, so
no INSERT there is its transaction's first.
--one-client N: pgbench with one client, N autocommit single-row INSERT transactions per round
(-M prepared, or --mode), synchronous_commit off: Postgres CPU per transaction, median and minimum
per table.)
The tables are built from schema 8's outbox_events (migrate --to-version 8), whose marks are a
CHECK and the id's default.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pgcost as pc  # noqa: E402

TABLES = ["plain", "plain2", "check", "default", "both", "seqlock", "lanefp", "stmtfp", "bothfp", "burn", "lanetype",
          "first"]


def table_of(t: str) -> str:
    """The table behind a name of TABLES: "both" is outbox_events itself."""
    return "outbox_events" if t == "both" else f"m_{t}"


def setup(db: pc.Db, relay_bin: str, work: Path) -> dict:
    pc.migrate(relay_bin, db.relay_env(), to_version=8)  # schema 8's marks: a CHECK and the id's default
    mark = db.psql("SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef AS d JOIN pg_attribute AS a "
                   "ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
                   "WHERE d.adrelid = 'outbox_events'::regclass AND a.attname = 'id'")
    check = db.psql("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = 'outbox_events'::regclass AND conname = 'outbox_events_lane_mark'")
    if "pg_try_advisory_xact_lock_shared" not in mark or not check:
        raise SystemExit(f"outbox_events has no statement mark in its id default or no lane mark: {mark!r} {check!r}")
    for t in [t for t in TABLES if t != "both"]:
        db.psql(f"CREATE TABLE m_{t} (LIKE outbox_events INCLUDING ALL) WITH (fillfactor = 50)",
                f"ALTER TABLE m_{t} DROP CONSTRAINT IF EXISTS outbox_events_lane_mark",
                f"ALTER TABLE m_{t} ALTER COLUMN id DROP DEFAULT")
    db.psql("ALTER TABLE m_plain ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY",
            "ALTER TABLE m_plain2 ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY",
            "ALTER TABLE m_burn ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY",
            "ALTER TABLE m_burn ADD CONSTRAINT m_burn_cpu CHECK (md5(repeat(topic, 1500)) <> '')",
            "ALTER TABLE m_check ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY",
            f"ALTER TABLE m_check ADD CONSTRAINT m_check_lane_mark {check}",
            "CREATE SEQUENCE m_default_id_seq",
            "ALTER TABLE m_default ALTER COLUMN id SET DEFAULT "
            + mark.replace("outbox_events_id_seq", "m_default_id_seq"),
            "CREATE SEQUENCE m_seqlock_id_seq", "CREATE SEQUENCE m_seqlock_mark",
            "ALTER TABLE m_seqlock ALTER COLUMN id SET DEFAULT "
            "CASE WHEN coalesce(pg_sequence_last_value('m_seqlock_mark'), 0) >= 0 "
            "THEN nextval('m_seqlock_id_seq') END")
    seqs = lambda p: "'{" + ",".join(f"{p}_{i}" for i in range(64)) + "}'::regclass[]"
    for i in range(64):
        db.psql(f"CREATE SEQUENCE m_lane_{i} CACHE 1000", f"CREATE SEQUENCE m_stmt_{i} CACHE 1000")
    stmt_fp = ("CASE WHEN nextval((" + seqs("m_stmt") + ")[((date_part('epoch', statement_timestamp()) * 1000000)"
               "::bigint & 63)::integer + 1]) > 0 THEN nextval('{seq}') END")
    lane_fp = "CHECK (processed_at IS NOT NULL OR nextval((" + seqs("m_lane") + ")[lane + 1]) > 0) NOT VALID"
    for t in ("lanefp", "stmtfp", "bothfp"):
        db.psql(f"CREATE SEQUENCE m_{t}_id_seq")
        default = stmt_fp.replace("{seq}", f"m_{t}_id_seq") if t != "lanefp" else \
            mark.replace("outbox_events_id_seq", f"m_{t}_id_seq")
        db.psql(f"ALTER TABLE m_{t} ALTER COLUMN id SET DEFAULT {default}",
                f"ALTER TABLE m_{t} ADD CONSTRAINT m_{t}_lane_mark {lane_fp if t != 'stmtfp' else check}")
    lane_ns = check.split("pg_try_advisory_xact_lock_shared(", 1)[1].split(",", 1)[0]
    db.psql("CREATE SEQUENCE m_lanetype_id_seq",
            "ALTER TABLE m_lanetype ALTER COLUMN id SET DEFAULT " + mark.replace("outbox_events_id_seq", "m_lanetype_id_seq"),
            "CREATE DOMAIN m_lanetype_lane AS smallint",
            "ALTER TABLE m_lanetype ALTER COLUMN lane TYPE m_lanetype_lane",
            f"ALTER DOMAIN m_lanetype_lane ADD CONSTRAINT m_lanetype_lane_mark "
            f"CHECK (pg_try_advisory_xact_lock_shared({lane_ns}, VALUE)) NOT VALID")
    first = mark.replace("outbox_events_id_seq", "m_first_id_seq").replace(
        "CASE WHEN ", "CASE WHEN statement_timestamp() - transaction_timestamp() <= interval '100 microseconds' OR ", 1)
    db.psql("CREATE SEQUENCE m_first_id_seq", "ALTER TABLE m_first ALTER COLUMN id SET DEFAULT " + first,
            "ALTER TABLE m_first ALTER COLUMN lane TYPE m_lanetype_lane")
    scripts = {t: pc.insert_script(work / f"insert-{t}.sql", table_of(t))
               for t in TABLES}
    return {"statement_mark": mark, "lane_mark": check, "scripts": {t: str(p) for t, p in scripts.items()}}


def report_us(us, tables, heading, column, key, a):
    """Prints the per-table medians and minima of `us` (with their difference to plain's median)
    and writes them to a.out under `key`."""
    print(f"\n{heading}\n")
    print(f"| table | {column} (median) | min | median over plain |\n| --- | ---: | ---: | ---: |")
    base = statistics.median(us["plain"]) if "plain" in us else None
    for t in tables:
        med = statistics.median(us[t])
        extra = f"{med - base:+.1f} us" if base is not None else "-"
        print(f"| {t} | {med:.1f} | {min(us[t]):.1f} | {extra} |")
    Path(a.out).write_text(json.dumps({key: us, "args": vars(a)}, indent=1))


def one_backend(db, tables, a):
    """Each table's INSERT + COMMIT on one backend, from a procedure (a prepared INSERT, as pgbench
    -M prepared sends it), synchronous_commit off; us per transaction, median and min of rounds."""
    for t in tables:
        db.psql(f"CREATE OR REPLACE PROCEDURE m_insert_{t}(n integer) LANGUAGE plpgsql AS $p$ BEGIN "
                f"FOR i IN 1..n LOOP INSERT INTO {table_of(t)} (topic, aggregate_id, payload) VALUES ('order.paid', "
                f"'k' || (1 + i % 1000), jsonb_build_object('order_id', i, 'amount_cents', 1999, 'currency', 'EUR', "
                f"'note', repeat('x', 44))); COMMIT; END LOOP; END $p$")
    us = {t: [] for t in tables}
    for r in range(a.rounds):
        for t in tables[r % len(tables):] + tables[:r % len(tables)]:
            db.psql(f"TRUNCATE {table_of(t)}", "CHECKPOINT")
            out = db.psql("SET synchronous_commit = off", f"CALL m_insert_{t}(1000)",
                          "SELECT set_config('marks.t0', clock_timestamp()::text, false)",
                          f"CALL m_insert_{t}({a.one_backend})",
                          "SELECT extract(epoch FROM clock_timestamp() - current_setting('marks.t0')::timestamptz) "
                          f"* 1e6 / {a.one_backend}")
            us[t].append(float(out.split()[-1]))
            pc.log("marks", f"round {r + 1} {t}: {us[t][-1]:.1f} us per transaction on one backend")
    report_us(us, tables, f"One backend, {a.one_backend} single-row INSERT transactions per round, "
              f"synchronous_commit off, {a.rounds} rounds", "us per transaction", "one_backend_us", a)


def one_client(db, info, tables, a):
    """Each table's autocommit single-row INSERT from one pgbench client (-M a.mode),
    synchronous_commit off: Postgres CPU per transaction, median and min of rounds."""
    env = dict(db.env, PGOPTIONS="-c synchronous_commit=off")
    us = {t: [] for t in tables}
    for r in range(a.rounds):
        for t in tables[r % len(tables):] + tables[:r % len(tables)]:
            db.psql(f"TRUNCATE {table_of(t)}", "CHECKPOINT")
            s0 = pc.Snapshot(db.postmaster)
            res = pc.pgbench(env, Path(info["scripts"][t]), 1, 1, 0, timeout=600, transactions=a.one_client, mode=a.mode)
            time.sleep(0.1)  # the backend exits; its CPU moves to the postmaster's children
            cpu = pc.window(s0, pc.Snapshot(db.postmaster))["postgres_cpu_seconds"]
            if res["exit_code"] != 0 or res["processed"] != a.one_client:
                raise SystemExit(f"pgbench failed on {t}: {res}")
            us[t].append(cpu / a.one_client * 1e6)
            pc.log("marks", f"round {r + 1} {t}: {us[t][-1]:.1f} us Postgres CPU per transaction, one client")
    report_us(us, tables, f"One client (-M {a.mode}), {a.one_client} autocommit single-row INSERT transactions "
              f"per round, synchronous_commit off, {a.rounds} rounds", "Postgres CPU per transaction",
              "one_client_us", a)


def side_by_side(db, info, tables, truncate, a):
    others = [t for t in tables if t != "plain"]
    ratios = {t: [] for t in others}
    for r in range(a.rounds):
        for t in others[r % len(others):] + others[:r % len(others)]:
            db.psql(truncate, "CHECKPOINT")
            time.sleep(0.2)
            procs = {x: pc.pgbench(db.env, Path(info["scripts"][x]), a.clients // 2, 1, a.seconds, popen=True)
                     for x in ("plain", t)}
            res = {x: pc.parse_pgbench(p.wait(), *p.communicate()) for x, p in procs.items()}
            ratios[t].append(res[t]["tps"] / res["plain"]["tps"])
            pc.log("marks", f"round {r + 1} {t} beside plain: {res[t]['tps']:.0f} / {res['plain']['tps']:.0f} "
                            f"commits/s = {ratios[t][-1]:.3f}")
    print(f"\n{a.clients // 2} writers on each of two tables at once, single-row INSERT txn, "
          f"{a.seconds:.0f} s per pair, {a.rounds} rounds\n")
    print("| table | ratio to plain beside it (median) | per round |\n| --- | ---: | --- |")
    for t in others:
        print(f"| {t} | {statistics.median(ratios[t]):.3f} | {', '.join(f'{x:.2f}' for x in ratios[t])} |")
    Path(a.out).write_text(json.dumps({"info": info, "ratios": ratios, "args": vars(a)}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--relay-bin", default=str(pc.ROOT / "build-bench" / "bin" / "outbox-relay"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tables", default=",".join(TABLES))
    ap.add_argument("--side-by-side", action="store_true")
    ap.add_argument("--one-backend", type=int, default=0, metavar="N",
                    help="N single-row transactions per round on one backend, from a procedure, instead of pgbench")
    ap.add_argument("--one-client", type=int, default=0, metavar="N",
                    help="N autocommit single-row transactions per round from one pgbench client, instead of 32")
    ap.add_argument("--mode", default="prepared", choices=["prepared", "extended", "simple"],
                    help="pgbench's query mode for --one-client")
    a = ap.parse_args()
    pc.terminate_on_signals()
    db = pc.Db(pc.bench_database_url(), a.pg_dir)
    info = setup(db, a.relay_bin, Path(a.work))
    tables = [t for t in TABLES if t in a.tables.split(",")]
    truncate = "TRUNCATE " + ", ".join(table_of(t) for t in TABLES) + " RESTART IDENTITY"
    if a.one_backend:
        return one_backend(db, tables, a)
    if a.one_client:
        return one_client(db, info, tables, a)
    if a.side_by_side:
        return side_by_side(db, info, tables, truncate, a)
    points = {t: [] for t in tables}
    for r in range(a.rounds):
        order = tables[r % len(tables):] + tables[:r % len(tables)]
        for t in order:
            db.psql(truncate, "CHECKPOINT")
            time.sleep(0.2)
            s0 = pc.Snapshot(db.postmaster)
            res = pc.pgbench(db.env, Path(info["scripts"][t]), a.clients, a.jobs, a.seconds)
            time.sleep(0.1)
            res["cpu"] = pc.window(s0, pc.Snapshot(db.postmaster))
            if res["exit_code"] != 0 or not res["tps"]:
                raise SystemExit(f"pgbench failed on {t}: {res}")
            res["pg_us_per_txn"] = res["cpu"]["postgres_cpu_seconds"] / res["processed"] * 1e6
            points[t].append(res)
            pc.log("marks", f"round {r + 1} {t}: {res['tps']:.0f} commits/s, "
                            f"{res['pg_us_per_txn']:.1f} us Postgres CPU per txn, "
                            f"steal {res['cpu']['steal_cores']} cores")
    base = statistics.median(p["tps"] for p in points["plain"])
    rows = ["| table | commits/s (median) | ratio to plain (per round) | Postgres CPU per txn |",
            "| --- | ---: | --- | ---: |"]
    for t in tables:
        tps = statistics.median(p["tps"] for p in points[t])
        per_round = ", ".join(f"{p['tps'] / q['tps']:.2f}" for p, q in zip(points[t], points["plain"]))
        cpu = statistics.median(p["pg_us_per_txn"] for p in points[t])
        rows.append(f"| {t} | {tps:,.0f} | {tps / base:.2f} ({per_round}) | {cpu:.1f} us |")
    print(f"\n{a.clients} writers, single-row INSERT txn, {a.seconds:.0f} s per point, {a.rounds} rounds\n")
    print("\n".join(rows))
    Path(a.out).write_text(json.dumps({"info": info, "points": points, "args": vars(a)}, indent=1))


if __name__ == "__main__":
    main()
