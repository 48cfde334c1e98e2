#!/usr/bin/env python3
"""The rounds of bench/webhook/run.sh: how fast the relay drains 10,000 events into a webhook
receiver that answers at once, with max_in_flight 1, 16 and 64, and how many TCP connections it
opened for them; a file sink (fsync off) drains the same events as the null-ish baseline.

One round per configuration and repetition, in a rotating order, each on a fresh database:
start the relay on an empty outbox and wait until it listens, insert all events in one statement
(one NOTIFY), and time from that commit until no row is pending. Connections and requests are
counted by the receiver (bench/webhook/receiver, Go); CPU of the relay, the receiver and the
rest of the machine is recorded, because other work shares these 2 cores.

Standard library only (plus the psql client). Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def psql(url: str, sql: str) -> str:
    return subprocess.run(["psql", "-X", "-q", "-At", url, "-c", sql], check=True, capture_output=True,
                          text=True).stdout.strip()


class PsqlSession:
    """One long-lived psql process for cheap polling (a psql per poll would cost more CPU than
    the relay on these 2 cores)."""

    def __init__(self, url: str):
        self.proc = subprocess.Popen(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def scalar(self, sql: str) -> str:
        self.proc.stdin.write(sql.rstrip(";") + ";\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"psql ended while running: {sql}")
        return line.strip()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime + stime


def postgres_cpu_seconds(postmaster: int) -> float:
    """The postmaster, the backends it reaped (cutime/cstime) and every live backend."""
    with open(f"/proc/{postmaster}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in fields[11:15])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                g = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(g[1]) == postmaster:
            total += int(g[11]) + int(g[12])
    return total / HZ


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = parts
    return (user + nice + system + irq + softirq + steal) / HZ


def control(base: str, path: str, method="GET") -> dict:
    req = urllib.request.Request(base + path, method=method)
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read()
    return json.loads(body) if body else {}


def wait_for_log(path: Path, needle: str, proc: subprocess.Popen, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"relay exited {proc.returncode}: {path.read_text()[-2000:]}")
        if path.exists() and needle in path.read_text():
            return
        time.sleep(0.02)
    raise RuntimeError(f"relay did not log {needle!r} within {timeout}s: {path.read_text()[-2000:]}")


def run_round(args, n: int, name: str, sink: dict, receiver_pid: int, control_base: str, postmaster: int) -> dict:
    db = f"wh_{n}"
    admin_url = args.url
    psql(admin_url, f"CREATE DATABASE {db}")
    url = admin_url.rsplit("/", 1)[0] + "/" + db
    try:
        subprocess.run([args.relay_bin, "migrate"], env={**os.environ, "DATABASE_URL": url}, check=True,
                       capture_output=True)
        config = {"database": {"url": url}, "http": {"enabled": False},
                  "relay": {"batch_size": args.batch_size, "sweep_interval": "30s"}, "sinks": [sink]}
        work = Path(args.work)
        config_path = work / f"relay-{n}.yaml"
        config_path.write_text(json.dumps(config))
        log_path = work / f"relay-{n}.log"
        with open(log_path, "w") as log:
            relay = subprocess.Popen([args.relay_bin, "run", "--config", str(config_path), "--log-level", "info"],
                                     stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_for_log(log_path, '"listening"', relay)
            time.sleep(0.3)  # lanes taken, first sweep-less idle wait entered
            if sink["type"] == "webhook":
                control(control_base, "/reset", "POST")
            poll = PsqlSession(url)
            relay_cpu0, rx_cpu0 = proc_cpu_seconds(relay.pid), proc_cpu_seconds(receiver_pid)
            pg_cpu0, busy0 = postgres_cpu_seconds(postmaster), machine_busy_seconds()
            t0 = time.monotonic()
            psql(url, "INSERT INTO outbox_events (topic, aggregate_id, payload) "
                      f"SELECT 'bench.event', 'key-' || (g % {args.keys}), "
                      f"jsonb_build_object('n', g, 'pad', repeat('x', {args.pad})) "
                      f"FROM generate_series(1, {args.events}) AS g")
            t_committed = time.monotonic()
            while True:
                left = int(poll.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL"))
                if left == 0:
                    break
                if time.monotonic() - t0 > args.round_timeout:
                    raise RuntimeError(f"{name}: {left} events still pending after {args.round_timeout}s")
                time.sleep(0.01)
            t1 = time.monotonic()
            poll.close()
            relay_cpu = proc_cpu_seconds(relay.pid) - relay_cpu0
            rx_cpu = proc_cpu_seconds(receiver_pid) - rx_cpu0
            pg_cpu = postgres_cpu_seconds(postmaster) - pg_cpu0
            busy = machine_busy_seconds() - busy0
            stats = control(control_base, "/stats") if sink["type"] == "webhook" else {}
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(timeout=30)
        dead = int(psql(url, "SELECT count(*) FROM outbox_events WHERE dead_lettered_at IS NOT NULL"))
        attempts = int(psql(url, "SELECT coalesce(sum(attempts), 0) FROM outbox_events"))
        if dead or attempts:
            raise RuntimeError(f"{name}: {dead} dead-lettered, {attempts} failed attempts: not a clean run")
        elapsed = t1 - t0
        return {
            "config": name,
            "seconds": round(elapsed, 4),
            "insert_seconds": round(t_committed - t0, 4),
            "events_per_second": round(args.events / elapsed, 1),
            "connections": stats.get("connections"),
            "requests": stats.get("requests"),
            "relay_cpu_us_per_event": round(relay_cpu / args.events * 1e6, 1),
            "receiver_cpu_seconds": round(rx_cpu, 3),
            "postgres_cpu_seconds": round(pg_cpu, 3),
            "machine_busy_cores": round(busy / elapsed, 2),
            # CPU that neither the relay, the receiver nor Postgres used: other work on the box.
            "foreign_cores": round(max(0.0, busy - relay_cpu - rx_cpu - pg_cpu) / elapsed, 2),
            "loadavg_1m": os.getloadavg()[0],
        }
    finally:
        psql(admin_url, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="admin URL of the throwaway cluster")
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--receiver-bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--pg-dir", required=True, help="the cluster directory (for the postmaster's pid)")
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--keys", type=int, default=1_000, help="distinct aggregate ids (per-key order limits concurrency)")
    p.add_argument("--pad", type=int, default=200, help="bytes of padding per payload")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--in-flight", default="1,16,64")
    p.add_argument("--round-timeout", type=float, default=300)
    p.add_argument("--no-baseline", action="store_true", help="skip the file sink rounds")
    args = p.parse_args()

    postmaster = int((Path(args.pg_dir) / "data" / "postmaster.pid").read_text().split()[0])
    receiver = subprocess.Popen([args.receiver_bin], stdout=subprocess.PIPE, text=True)
    try:
        hooks_addr, control_addr = receiver.stdout.readline().split()
        hook_url, control_base = f"http://{hooks_addr}/hooks", f"http://{control_addr}"
        configs = [(f"webhook max_in_flight={m}",
                    {"name": "hooks", "type": "webhook", "url": hook_url, "max_in_flight": int(m), "timeout": "10s",
                     "secrets": ["whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]})
                   for m in args.in_flight.split(",")]
        if not args.no_baseline:
            configs.append(("file sink, fsync off (baseline)",
                            {"name": "file", "type": "file", "path": str(Path(args.work) / "baseline.jsonl"),
                             "fsync": False}))
        results, n = [], 0
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]  # rotate the order per round
            for name, sink in order:
                n += 1
                res = run_round(args, n, name, sink, receiver.pid, control_base, postmaster)
                res["round"] = r + 1
                results.append(res)
                print(f"[bench] round {r + 1} {name}: {res['events_per_second']:.0f} events/s, "
                      f"{res['connections']} connections, {res['relay_cpu_us_per_event']} us relay CPU/event, "
                      f"machine busy {res['machine_busy_cores']} cores, foreign {res['foreign_cores']}", file=sys.stderr)
    finally:
        receiver.terminate()
        receiver.wait()

    summary = []
    for name, _ in configs:
        rs = [x for x in results if x["config"] == name]
        summary.append({
            "config": name,
            "events_per_second_median": round(statistics.median(x["events_per_second"] for x in rs)),
            "events_per_second_min": round(min(x["events_per_second"] for x in rs)),
            "events_per_second_max": round(max(x["events_per_second"] for x in rs)),
            "connections": sorted({x["connections"] for x in rs}, key=lambda c: (c is None, c)),
            "relay_cpu_us_per_event_median": statistics.median(x["relay_cpu_us_per_event"] for x in rs),
            "receiver_cpu_us_per_event_median": round(statistics.median(x["receiver_cpu_seconds"] for x in rs) / args.events * 1e6, 1),
            "foreign_cores_median": statistics.median(x["foreign_cores"] for x in rs),
        })
    baseline = summary[-1]["events_per_second_median"] if not args.no_baseline else None
    for s in summary:
        s["ratio_to_baseline"] = round(s["events_per_second_median"] / baseline, 2) if baseline else None

    machine = {
        "cpus": os.cpu_count(),
        "cpu_model": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), ""),
        "kernel": platform.release(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
    report = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
              "params": {k: getattr(args, k) for k in ("events", "keys", "pad", "batch_size", "rounds")},
              "summary": summary, "rounds": results}
    Path(args.out).write_text(json.dumps(report, indent=2))

    print(f"\n{args.events} events, {args.keys} keys, {args.pad}-byte padding, batch {args.batch_size}, "
          f"{args.rounds} rounds (median, min-max); {machine['cpus']} cores, {machine['cpu_model']}")
    print("| sink | events/s | min-max | TCP connections opened | relay CPU us/event | receiver CPU us/event "
          "| foreign load (cores) | vs file baseline |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in summary:
        conns = "-" if s["connections"] == [None] else ", ".join(str(c) for c in s["connections"])
        print(f"| {s['config']} | {s['events_per_second_median']} | {s['events_per_second_min']}-"
              f"{s['events_per_second_max']} | {conns} | {s['relay_cpu_us_per_event_median']} | "
              f"{s['receiver_cpu_us_per_event_median'] if s['connections'] != [None] else '-'} | "
              f"{s['foreign_cores_median']} | {s['ratio_to_baseline']} |")


if __name__ == "__main__":
    main()
