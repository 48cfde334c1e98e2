"""Shared helpers of bench/writers.py and bench/steady.py (what the outbox costs the database).

- Connection settings: the scripts get one URL with a password; psql and pgbench get it through
  the PG* environment variables and the relay through DATABASE_URL, never on a command line.
- CPU from /proc: the relay process (utime + stime, all its threads), and Postgres: every process
  of *our* cluster whose comm is "postgres" (the postmaster and its children; other clusters on
  the machine, e.g. a test run's, are not counted), utime + stime + cutime + cstime. A backend
  that exits is reaped by the postmaster, whose cutime/cstime then holds its whole CPU: taking
  deltas of that sum counts every backend exactly once (a live backend at the start of a window
  counts from there; one that exits inside the window moves from "live" to the postmaster's
  cutime with its whole life, minus what the start snapshot held). Resolution: clock ticks
  (1/HZ s) per process and snapshot.
- The relay: started from a copy of the binary (a rebuild during a run cannot mix versions), its
  YAML config written here, readiness and /metrics through its HTTP listener.
- A tailer thread that stamps each line of the file sink with time.time() when it appears
  (inotify through ctypes; polling every 0.5 ms if inotify is unavailable).

Standard library only."""
from __future__ import annotations

import ctypes
import ctypes.util
import datetime as dt
import hashlib
import json
import math
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]


def terminate_on_signals():
    """SIGINT/SIGTERM/SIGHUP (the .sh script's trap forwards Ctrl-C as SIGTERM) raise
    KeyboardInterrupt once, so the finally blocks stop the relay and the writers before the
    cluster goes away; later signals are ignored so that they cannot cut that cleanup short."""
    state = {"seen": False}

    def handler(signum, _frame):
        if state["seen"]:
            return
        state["seen"] = True
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def log(tag, msg):
    print(f"[{tag} {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Connection settings

def pg_env(url: str) -> dict:
    """The environment for psql/pgbench/libpq: PG* variables from the URL (TCP, with password)."""
    u = urllib.parse.urlsplit(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") or k == "PGBIN"}
    env.update({
        "PGHOST": u.hostname or "127.0.0.1",
        "PGPORT": str(u.port or 5432),
        "PGUSER": urllib.parse.unquote(u.username or "postgres"),
        "PGDATABASE": urllib.parse.unquote(u.path.lstrip("/") or "postgres"),
        "PGAPPNAME": "outbox-cost-bench",
    })
    if u.password:
        env["PGPASSWORD"] = urllib.parse.unquote(u.password)
    return env


def url_without_password(url: str) -> str:
    """For tools that insist on a --url: libpq takes the password from PGPASSWORD."""
    u = urllib.parse.urlsplit(url)
    netloc = (u.username + "@" if u.username else "") + (u.hostname or "") + (f":{u.port}" if u.port else "")
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))


def bench_database_url(name="bench") -> str:
    """BENCH_DATABASE_URL (the cluster's URL, set by the .sh script; kept off command lines):
    creates database `name` there and returns its URL."""
    url = os.environ.get("BENCH_DATABASE_URL")
    if not url:
        raise SystemExit("BENCH_DATABASE_URL is not set: run the .sh script, which starts a throwaway cluster")
    u = urllib.parse.urlsplit(url)
    env = pg_env(url)
    exists = subprocess.run(["psql", "-X", "-At", "-c", f"SELECT 1 FROM pg_database WHERE datname = '{name}'"],
                            capture_output=True, text=True, env=env, check=True).stdout.strip()
    if not exists:
        subprocess.run(["psql", "-X", "-q", "-c", f"CREATE DATABASE {name}"], capture_output=True, text=True,
                       env=env, check=True)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + name, u.query, u.fragment))


class Db:
    def __init__(self, url: str, pg_dir: str):
        self.url = url
        self.env = pg_env(url)
        self.postmaster = int((Path(pg_dir) / "data" / "postmaster.pid").read_text().split()[0])

    def psql(self, *sqls: str, timeout=600) -> str:
        """Each statement in its own -c (VACUUM and CHECKPOINT cannot share a transaction)."""
        cmd = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]
        for s in sqls:
            cmd += ["-c", s]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        if p.returncode != 0:
            raise RuntimeError(f"psql failed ({p.returncode}): {p.stderr.strip()[-2000:]}\n  SQL: {sqls}")
        return p.stdout.strip()

    def relay_env(self) -> dict:
        env = dict(self.env)
        env["DATABASE_URL"] = self.url
        return env

    def meta(self) -> dict:
        return {
            "postgres": self.psql("SHOW server_version"),
            "postgres_fsync": self.psql("SHOW fsync"),
            "synchronous_commit": self.psql("SHOW synchronous_commit"),
            "shared_buffers": self.psql("SHOW shared_buffers"),
        }

    def schema_versions(self) -> dict:
        rows = self.psql("SELECT table_name || '=' || max(version) FROM outbox_schema_migrations GROUP BY table_name "
                         "ORDER BY 1")
        return {r.split("=")[0]: int(r.split("=")[1]) for r in rows.splitlines() if r}

    def triggers(self, table: str) -> list:
        out = self.psql(f"SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger "
                        f"WHERE tgrelid = '{table}'::regclass AND NOT tgisinternal")
        return [t for t in out.split(",") if t]

    def pending(self, table="outbox_events") -> int:
        return int(self.psql(f"SELECT count(*) FROM {table} WHERE processed_at IS NULL AND dead_lettered_at IS NULL"))

    def app_names(self) -> dict:
        """pid -> application_name of every backend now (this psql's own backend included)."""
        rows = self.psql("SELECT pid || '|' || coalesce(application_name, '') FROM pg_stat_activity "
                         "WHERE backend_type = 'client backend'")
        return {int(r.split("|", 1)[0]): r.split("|", 1)[1] for r in rows.splitlines() if r}

    def autovacuum_counts(self, table="outbox_events") -> int:
        """autovacuum + autoanalyze runs so far (for telling whether one ran inside a window)."""
        v = self.psql(f"SELECT coalesce(autovacuum_count + autoanalyze_count, 0) FROM pg_stat_user_tables "
                      f"WHERE relid = '{table}'::regclass")
        return int(v or 0)


class PsqlSession:
    """One long-lived psql process fed through stdin: one connection for many statements, so a
    burst of commits is not slowed by connection set-up. run() waits until psql has executed the
    statements (an \\echo marker after them)."""

    def __init__(self, env: dict, stderr_path: Path):
        self.err = open(stderr_path, "ab")
        self.p = subprocess.Popen(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, env=env, text=True, bufsize=1)
        self.n = 0
        self.stderr_path = stderr_path

    def run(self, sql: str) -> list:
        self.n += 1
        marker = f"__pgcost_done_{self.n}__"
        self.p.stdin.write(sql.rstrip() + "\n\\echo " + marker + "\n")
        self.p.stdin.flush()
        out = []
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"psql session ended: {Path(self.stderr_path).read_text()[-2000:]}")
            line = line.rstrip("\n")
            if line == marker:
                return out
            out.append(line)

    def close(self):
        try:
            if self.p.poll() is None:
                self.p.stdin.close()
                self.p.wait(timeout=10)
        except Exception:
            self.p.kill()
        finally:
            self.err.close()


# --------------------------------------------------------------------------------------------
# CPU accounting

def _stat(pid: int):
    """(comm, fields from 'state' on) of /proc/PID/stat, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    lp, rp = text.index("("), text.rindex(")")
    return text[lp + 1:rp], text[rp + 2:].split()


# Indexes into the fields from 'state' (field 3) on: ppid is field 4, utime..cstime fields 14-17.
_PPID, _UTIME, _STIME, _CUTIME, _CSTIME = 1, 11, 12, 13, 14


def postgres_processes(postmaster: int) -> dict:
    """pid -> [title, utime + stime seconds] of our cluster's live processes; the postmaster's
    entry holds its own CPU and, under the pid -1, the CPU of its reaped children."""
    procs = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        s = _stat(pid)
        if s is None or s[0] != "postgres" or (pid != postmaster and int(s[1][_PPID]) != postmaster):
            continue
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        f = s[1]
        procs[pid] = [title.strip(), (int(f[_UTIME]) + int(f[_STIME])) / HZ]
        if pid == postmaster:
            procs[-1] = ["exited children", (int(f[_CUTIME]) + int(f[_CSTIME])) / HZ]
    return procs


def postgres_cpu_seconds(procs: dict) -> float:
    """Our cluster's CPU from a postgres_processes() snapshot: every live process's utime + stime
    plus the postmaster's reaped children. A backend that exits is reaped by the postmaster, so
    deltas of this sum count every backend exactly once; one that exits during the /proc scan may
    be counted twice (read live, then in the postmaster's cutime), never lost; windows start and
    end when no connection is closing."""
    return sum(cpu for _, cpu in procs.values())


def postgres_cpu_by_kind(a: dict, b: dict, app_names: dict) -> dict:
    """CPU seconds between two postgres_processes() snapshots, by kind: the relay's sessions by
    application_name ("outbox-relay worker", ...), auxiliary processes by title (walwriter,
    checkpointer, ...), other live backends, and "exited" (backends and autovacuum workers that
    ended inside the window: the postmaster's reaped-children CPU, less what the first snapshot
    had already counted of them). app_names: pid -> application_name, read after b."""
    kinds = {}

    def add(kind, sec):
        kinds[kind] = round(kinds.get(kind, 0.0) + sec, 3)

    for pid, (title, cpu) in b.items():
        if pid == -1:
            gone = sum(v[1] for p, v in a.items() if p > 0 and p not in b)
            add("exited (backends, autovacuum workers)", cpu - a.get(-1, ["", 0.0])[1] - gone)
            continue
        delta = cpu - (a[pid][1] if pid in a else 0.0)
        name = app_names.get(pid, "")
        if name.startswith("outbox-relay"):
            add(name, delta)
        elif pid in app_names:
            add("other backends", delta)
        else:
            kind = re.sub(r"^postgres: (\S+/\S+: )?", "", title)
            add(kind if not re.search(r"\(\d+\)", kind) else "other backends", delta)
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def process_cpu_seconds(pid: int):
    """utime + stime of a live process (all its threads), or None."""
    s = _stat(pid)
    if s is None:
        return None
    return (int(s[1][_UTIME]) + int(s[1][_STIME])) / HZ


def machine_cpu_seconds() -> tuple:
    """(busy, steal) of all cores, in seconds: busy includes steal (time the hypervisor gave
    another guest while this one had work)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    return (user + nice + system + irq + softirq + steal) / HZ, steal / HZ


def cpu_pressure_seconds():
    """/proc/pressure/cpu "some" total in seconds: time at least one runnable task waited for a
    core; None without PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(re.search(r"total=(\d+)", f.readline()).group(1)) / 1e6
    except (OSError, AttributeError):
        return None


def own_cpu_seconds() -> float:
    """This Python process (with the tailer thread) plus its reaped children (pgbench, psql)."""
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


class Snapshot:
    """children: pids of live child processes (pgbench started with popen=True), whose CPU
    getrusage counts only once they are reaped."""

    def __init__(self, postmaster: int, relay_pid: int | None = None, children=()):
        self.t = time.monotonic()
        self.procs = postgres_processes(postmaster)
        if -1 not in self.procs:
            raise RuntimeError(f"postmaster {postmaster} is gone")
        self.pg = postgres_cpu_seconds(self.procs)
        self.relay = process_cpu_seconds(relay_pid) if relay_pid else None
        self.machine, self.steal = machine_cpu_seconds()
        self.pressure = cpu_pressure_seconds()
        self.own = own_cpu_seconds() + sum(process_cpu_seconds(p) or 0.0 for p in children)


def window(a: Snapshot, b: Snapshot, relay_children_cpu: float = 0.0) -> dict:
    """CPU used between two snapshots. foreign = the rest of the machine (other work on these
    cores: a build, a test run): a figure taken with foreign load is suspect."""
    wall = b.t - a.t
    pg = b.pg - a.pg
    relay = (b.relay - a.relay) if (a.relay is not None and b.relay is not None) else 0.0
    own = b.own - a.own
    foreign = max(0.0, (b.machine - a.machine) - pg - relay - own)
    return {
        "wall_seconds": round(wall, 3),
        "postgres_cpu_seconds": round(pg, 3),
        "relay_cpu_seconds": round(relay, 3) if a.relay is not None else None,
        "client_cpu_seconds": round(own, 3),
        "foreign_cpu_seconds": round(foreign, 3),
        "foreign_cores": round(foreign / wall, 3) if wall > 0 else None,
        "machine_cores": round((b.machine - a.machine) / wall, 3) if wall > 0 else None,
        "steal_cores": round((b.steal - a.steal) / wall, 3) if wall > 0 else None,
        "cpu_pressure": (round((b.pressure - a.pressure) / wall, 3)
                         if wall > 0 and a.pressure is not None and b.pressure is not None else None),
    }


# --------------------------------------------------------------------------------------------
# pgbench

def pgbench(env: dict, script: Path, clients: int, jobs: int, seconds: float, rate: float | None = None,
            timeout: float | None = None, popen=False, log_prefix: Path | None = None, extra=(),
            transactions: int | None = None, mode: str = "prepared"):
    """log_prefix: per-transaction log (-l), read back by txn_log_summary(); extra: more pgbench
    options (e.g. --sampling-rate=0.1 with log_prefix); transactions: that many per client (-t)
    instead of `seconds`; mode: pgbench's query mode (-M: prepared, extended or simple)."""
    length = ["-t", str(transactions)] if transactions else ["-T", str(int(math.ceil(seconds)))]
    cmd = ["pgbench", "-n", "-M", mode, "-c", str(clients), "-j", str(min(jobs, clients)), *length,
           "-f", str(script)]
    if rate:
        cmd += ["-R", str(rate)]
    if log_prefix:
        for old in log_prefix.parent.glob(log_prefix.name + ".*"):
            old.unlink()
        cmd += ["-l", f"--log-prefix={log_prefix}"]
    cmd += list(extra)
    if popen:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout or seconds + 120)
    return parse_pgbench(p.returncode, p.stdout, p.stderr)


def parse_pgbench(code: int, out: str, err: str) -> dict:
    def num(rx, cast=float):
        m = re.search(rx, out)
        return cast(m.group(1)) if m else None
    r = {
        "exit_code": code,
        "tps": num(r"tps = ([0-9.]+)"),
        "processed": num(r"number of transactions actually processed: (\d+)", int),
        "failed": num(r"number of failed transactions: (\d+)", int) or 0,
        "latency_avg_ms": num(r"latency average = ([0-9.]+) ms"),
        "schedule_lag_avg_ms": num(r"rate limit schedule lag: avg ([0-9.]+)"),
        "schedule_lag_max_ms": num(r"rate limit schedule lag: avg [0-9.]+ \(max ([0-9.]+)"),
    }
    if code != 0 or r["tps"] is None or r["processed"] is None:
        raise RuntimeError(f"pgbench failed ({code}): {err.strip()[-2000:]}\n{out[-1000:]}")
    return r


def pgbench_log(log_prefix: Path):
    """The transactions of pgbench -l (client txn_no time_us script epoch us [lag]), as
    (client, txn_no, epoch s when its COMMIT returned, execution ms = time - schedule lag, i.e.
    from sending the first statement to COMMIT returning)."""
    for f in log_prefix.parent.glob(log_prefix.name + ".*"):
        with open(f) as fh:
            for line in fh:
                p = line.split()
                if len(p) >= 6:
                    lag = int(p[6]) if len(p) >= 7 and p[6].lstrip("-").isdigit() else 0
                    yield int(p[0]), int(p[1]), int(p[4]) + int(p[5]) / 1e6, (int(p[2]) - lag) / 1000


def txn_log_summary(log_prefix: Path, since=None, until=None) -> dict:
    """The writers' own transaction times from pgbench -l, of those whose COMMIT returned between
    since and until (epoch s, if given). A slow commit (a WAL flush stalled by other I/O) shows
    here, not in the relay."""
    v = sorted(ms for _, _, end, ms in pgbench_log(log_prefix)
               if (since is None or end >= since) and (until is None or end <= until))
    return {"count": len(v), "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99), "max_ms": pct(v, 1.0)}


def commit_times(log_prefix: Path, rows: list) -> dict | None:
    """id -> when its transaction's COMMIT returned to the writer (epoch seconds), for rows written
    by insert_script(tag_client=True), one event per transaction: rows is [(id, order_id)]. A
    client runs its transactions one after the other, so its k-th row in id order is its k-th
    transaction in pgbench's log (client txn_no time script epoch us [lag]). None if the counts
    differ (a failed transaction)."""
    logged = {}
    for client, txn, end, _ in pgbench_log(log_prefix):
        logged.setdefault(client, []).append((txn, end))
    by_client = {}
    for rid, order in rows:
        by_client.setdefault(order // CLIENT_TAG, []).append(rid)
    out = {}
    for client, ids in by_client.items():
        txns = sorted(logged.get(client, []))
        if len(txns) != len(ids):
            return None
        for rid, (_, t) in zip(sorted(ids), txns):
            out[rid] = t
    return out


# Writers' event: topic, aggregate_id 'k' || 1..1000, a payload of about 100 bytes of JSON.
def payload_expr(order_expr: str) -> str:
    return ("('{\"order_id\": ' || " + order_expr + " || ', \"amount_cents\": 1999, \"currency\": \"EUR\", "
            "\"customer\": \"c-00042\", \"status\": \"paid\"}')::jsonb")


def event_values(key_expr: str, order_expr: str, topic: str = "order.paid") -> str:
    return "('" + topic + "', 'k' || " + key_expr + ", " + payload_expr(order_expr) + ")"


# tag_client: order ids of client c (pgbench's :client_id) are c * 10,000,000 + 1..9,999,999, so
# that each row can be matched with its transaction in pgbench's log (commit_times()).
CLIENT_TAG = 10_000_000


def insert_script(path: Path, table: str, events_per_txn: int = 1, tag_client=False) -> Path:
    """One INSERT per transaction of `events_per_txn` events (each its own random key)."""
    if events_per_txn == 1:
        order = f":client_id * {CLIENT_TAG} + random(1, {CLIENT_TAG - 1})" if tag_client else "random(1, 10000000)"
        path.write_text(f"\\set k random(1, 1000)\n\\set o {order}\n"
                        f"INSERT INTO {table} (topic, aggregate_id, payload) VALUES {event_values(':k', ':o')};\n")
    else:
        path.write_text(f"INSERT INTO {table} (topic, aggregate_id, payload) SELECT 'order.paid', "
                        f"'k' || (1 + floor(random() * 1000)::int), {payload_expr('(floor(random() * 10000000)::int)')} "
                        f"FROM generate_series(1, {events_per_txn});\n")
    return path


def update_insert_script(path: Path, table: str, orders: int) -> Path:
    path.write_text(f"\\set id random(1, {orders})\n\\set k random(1, 1000)\n"
                    "BEGIN;\n"
                    "UPDATE orders SET amount = amount + 1, updated_at = now() WHERE id = :id;\n"
                    f"INSERT INTO {table} (topic, aggregate_id, payload) VALUES {event_values(':k', ':id')};\n"
                    "COMMIT;\n")
    return path


# --------------------------------------------------------------------------------------------
# The relay

def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def snapshot_binary(path: str, dest_dir: Path, wait_seconds: float, tag: str, version_check=True) -> dict:
    """Copy the binary once it exists and has not changed for 2 s (a rebuild in progress), so a
    rebuild during the run cannot mix versions. Returns its description."""
    src = Path(path)
    deadline = time.monotonic() + wait_seconds
    said = False
    while True:
        try:
            st = src.stat()
            if time.time() - st.st_mtime >= 2:
                break
        except FileNotFoundError:
            st = None
        if time.monotonic() > deadline or not src.parent.is_dir():
            raise SystemExit(f"{src}: {'missing' if st is None else 'still changing'}. "
                             "Build it (Release), e.g.: cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release "
                             "&& ninja -C build-bench outbox-relay outbox-bench; or pass --relay-bin")
        if not said:
            log(tag, f"waiting for {src} ({'missing' if st is None else 'being rebuilt'}; up to {wait_seconds:.0f} s)")
            said = True
        time.sleep(1)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    shutil.copy2(src, dest)
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()[:16]
    version = None
    if version_check:
        v = subprocess.run([str(dest), "--version"], capture_output=True, text=True, timeout=30)
        if v.returncode != 0:
            raise SystemExit(f"{src} --version failed: {v.stderr.strip()}")
        version = v.stdout.strip()
    return {"path": str(src.resolve()), "copy": str(dest), "sha256_16": digest, "version": version,
            "mtime": dt.datetime.fromtimestamp(st.st_mtime).astimezone().isoformat(timespec="seconds")}


def migrate(relay_bin: str, env: dict, table: str | None = None, to_version: int | None = None):
    cmd = [relay_bin]
    if table:
        cmd += ["--table", table]
    cmd += ["migrate"]
    if to_version:
        cmd += ["--to-version", str(to_version)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout.strip()


def parse_extra(fragment: str):
    """A YAML fragment for the relay: section: block lines ('a: 1' newline 'b: 2'), or one flow
    mapping '{a: 1, b: 2}' (no nesting), or 'a: 1; b: 2'. Returns (lines, top-level keys)."""
    text = (fragment or "").strip()
    if not text:
        return [], set()
    if text.startswith("{") and text.endswith("}"):
        lines = [p.strip() for p in text[1:-1].split(",") if p.strip()]
    elif "\n" not in text and ";" in text:
        lines = [p.strip() for p in text.split(";") if p.strip()]
    else:
        lines = text.splitlines()
    keys = set()
    for line in lines:
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*:", line)
        if m:
            keys.add(m.group(1))
    return lines, keys


def write_relay_config(path: Path, sink: Path, http_port: int | None, relay: dict, extra: str = "",
                       log_level="info", pinned=(), fsync=True, table: str | None = None, tracing: str = "") -> Path:
    """YAML without database.url (the relay reads DATABASE_URL); `table` the outbox table if not
    outbox_events. `extra` lines go into relay:
    and replace keys of `relay` with the same name, except the `pinned` keys (a measurement's
    premise, e.g. sweep_interval 1h of the bursty test), whose one-line settings in `extra` are
    dropped. `tracing`: lines of a tracing: section (as `extra`), none when empty."""
    extra_lines, extra_keys = parse_extra(extra)
    for k in pinned:
        if k in extra_keys:
            extra_keys.discard(k)
            extra_lines = [l for l in extra_lines if not re.match(rf"{k}\s*:", l)]
            log("config", f"relay.{k} is fixed to {relay[k]} for this measurement; the extra setting is ignored")
    out = (["database:", f"  table: {table}"] if table else []) + ["relay:"]
    for k, v in relay.items():
        if k not in extra_keys:
            out.append(f"  {k}: {v}")
    out += ["  " + line for line in extra_lines]
    if http_port:
        out += ["http:", "  enabled: true", f"  listen: 127.0.0.1:{http_port}"]
    else:
        out += ["http:", "  enabled: false"]
    if tracing:
        out += ["tracing:"] + ["  " + line for line in parse_extra(tracing)[0]]
    out += ["log:", f"  level: {log_level}",
            "sinks:", "  - name: bench", "    type: file", f"    path: {json.dumps(str(sink))}", f"    fsync: {'true' if fsync else 'false'}", ""]
    path.write_text("\n".join(out))
    return path


class Relay:
    """`outbox-relay run` with DATABASE_URL in its environment; output to a log file."""

    def __init__(self, relay_bin: str, config: Path, env: dict, log_path: Path, http_port: int | None):
        self.log_path = log_path
        self.http_port = http_port
        self.log_file = open(log_path, "ab")
        self.p = subprocess.Popen([relay_bin, "run", "--config", str(config)], env=env, stdin=subprocess.DEVNULL,
                                  stdout=self.log_file, stderr=subprocess.STDOUT)
        self.pid = self.p.pid
        self.exit_code = None

    def alive(self) -> bool:
        return self.p.poll() is None

    def log_tail(self, n=3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def _get(self, path: str, timeout=5):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")

    def wait_ready(self, timeout=60.0):
        """/readyz answers 200 (the database and LISTEN sessions are up, sinks usable). Without an
        HTTP listener: the log says it started, or 3 s passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"relay exited with {self.p.returncode}:\n{self.log_tail()}")
            if self.http_port:
                try:
                    status, _ = self._get("/readyz", timeout=1)
                    if status == 200:
                        return
                except Exception:
                    pass
            elif time.monotonic() > deadline - timeout + 3:
                return
            time.sleep(0.05)
        raise RuntimeError(f"relay not ready after {timeout} s:\n{self.log_tail()}")

    def metrics(self) -> dict:
        """Prometheus text -> {'name{labels}': value}; {} without a listener or on failure."""
        if not self.http_port:
            return {}
        try:
            _, text = self._get("/metrics")
        except Exception:
            return {}
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
        return out

    def cpu_seconds(self):
        return process_cpu_seconds(self.pid)

    def stop(self, timeout=30.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.exit_code = self.p.returncode
        self.log_file.close()
        return self.exit_code


def metric_sum(m: dict, name: str, **labels) -> float | None:
    """Sum of the series of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for key, v in m.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{val}"' in rest for k, val in labels.items()):
            total += v
            found = True
    return total if found else None


def metrics_delta(before: dict, after: dict) -> dict:
    """Claims, published events and wakeups by source between two scrapes."""
    if not before or not after:
        return {}

    def d(name, **labels):
        a, b = metric_sum(before, name, **labels), metric_sum(after, name, **labels)
        return None if a is None or b is None else b - a
    out = {
        "claims": d("outbox_relay_claim_duration_seconds_count"),
        "claim_seconds": d("outbox_relay_claim_duration_seconds_sum"),
        "published": d("outbox_relay_events_published_total"),
        "wakeups": {},
    }
    for key in after:
        if key.startswith("outbox_relay_wakeups_total{"):
            src = re.search(r'source="([^"]*)"', key)
            if src:
                out["wakeups"][src.group(1)] = d("outbox_relay_wakeups_total", source=src.group(1))
    if out["claims"] and out["published"] is not None:
        out["events_per_claim"] = round(out["published"] / out["claims"], 2)
    return out


# --------------------------------------------------------------------------------------------
# The sink tailer

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000


def inotify_fd(path: Path):
    """A non-blocking inotify descriptor watching `path` for writes, or None (then poll)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, str(path).encode(), _IN_MODIFY) < 0:
            os.close(fd)
            return None
        return fd
    except (OSError, AttributeError):
        return None


class Tailer(threading.Thread):
    """Reads the sink file as it grows and stamps every complete line with time.time() right
    after reading it (so a stamp is never earlier than the line's arrival; it may be later by
    the read and the wakeup of this thread, tens of microseconds)."""

    def __init__(self, path: Path, poll_seconds=0.0005):
        super().__init__(daemon=True)
        self.path = Path(path)
        self.path.touch()
        self.poll_seconds = poll_seconds
        self.stamps = []   # (time.time(), line bytes)
        self.lock = threading.Lock()
        self.target = None
        self.reached = threading.Event()
        self.reached_at = None  # time.monotonic() when target lines were read
        self._halt = threading.Event()
        self.mode = None
        self.error = None

    def set_target(self, n: int):
        with self.lock:
            self.target = n
            if len(self.stamps) >= n:
                self.reached_at = self.reached_at or time.monotonic()
                self.reached.set()

    def count(self) -> int:
        return len(self.stamps)

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            self.error = repr(e)

    def _run(self):
        fd = os.open(self.path, os.O_RDONLY)
        ino = inotify_fd(self.path)
        poller = None
        if ino is not None:
            poller = select.poll()
            poller.register(ino, select.POLLIN)
            self.mode = "inotify"
        else:
            self.mode = f"polling every {self.poll_seconds * 1000:.1f} ms"
        partial = b""
        try:
            while not self._halt.is_set():
                if poller is not None:
                    if poller.poll(50):
                        try:
                            while os.read(ino, 65536):
                                pass
                        except BlockingIOError:
                            pass
                else:
                    time.sleep(self.poll_seconds)
                chunks = []
                while True:
                    data = os.read(fd, 1 << 20)
                    if not data:
                        break
                    chunks.append(data)
                if not chunks:
                    continue
                now = time.time()
                data = partial + b"".join(chunks)
                lines = data.split(b"\n")
                partial = lines.pop()
                if lines:
                    self.take_lines(lines, now)
        finally:
            os.close(fd)
            if ino is not None:
                os.close(ino)

    def take_lines(self, lines: list, now: float):
        """Complete lines read at `now` (time.time()); a subclass may keep less."""
        with self.lock:
            self.stamps.extend((now, l) for l in lines if l)
            if self.target is not None and len(self.stamps) >= self.target and not self.reached.is_set():
                self.reached_at = time.monotonic()
                self.reached.set()

    def stop(self):
        self._halt.set()
        self.join(timeout=5)

    def events(self):
        """[(id, arrival epoch seconds, created_at epoch seconds)] in arrival order."""
        out = []
        for t, line in self.stamps:
            e = json.loads(line)
            created = dt.datetime.fromisoformat(e["created_at"].replace("Z", "+00:00")).timestamp()
            out.append((e["id"], t, created))
        return out


def latency_summary(samples_ms: list) -> dict:
    v = sorted(samples_ms)
    return {"count": len(v), "p50_ms": pct(v, 0.50), "p90_ms": pct(v, 0.90), "p99_ms": pct(v, 0.99),
            "max_ms": pct(v, 1.0), "min_ms": pct(v, 0.0)}


def exactly_once(file_ids: list, db_ids: list) -> dict:
    from collections import Counter
    c = Counter(file_ids)
    dbs = set(db_ids)
    missing = sorted(dbs - set(c))
    extra = sorted(set(c) - dbs)
    dup = sorted(i for i, n in c.items() if n > 1)
    return {"events_in_table": len(dbs), "lines_in_sink": len(file_ids), "missing": len(missing),
            "duplicated": len(dup), "unknown_ids": len(extra), "missing_sample": missing[:10],
            "duplicated_sample": dup[:10], "ok": not missing and not dup and not extra}


# --------------------------------------------------------------------------------------------
# Numbers and the report

def pct(sorted_values, q):
    v = sorted_values
    if not v:
        return None
    if q <= 0:
        return round(v[0], 3)
    return round(v[max(1, math.ceil(q * len(v))) - 1], 3)


def median(values, digits=1):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), digits) if values else None


def fmt(x, digits=0, suffix=""):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}{suffix}"
    return f"{x:,}{suffix}"


def held(v):
    return "n/a" if v is None else ("yes" if v else "**no**")


def md_table(header: list, rows: list, align=None) -> str:
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def git_state():
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "relay", "schema", "CMakeLists.txt")
    return head + (" + uncommitted changes in relay/ or schema/" if dirty else ""), dirty.splitlines()


def base_meta(db: Db) -> dict:
    git, dirty = git_state()
    return {"started_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"), "git": git,
            "git_dirty_files": dirty, "nproc": os.cpu_count(), "hz": HZ,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()], **db.meta()}


def write_json(doc: dict, out: Path, latest_name: str):
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    shutil.copyfile(out, out.parent / latest_name)
