#!/usr/bin/env python3
"""What exactly_once: true costs (issue 44), in one run beside the at-least-once Kafka sink on the
same broker, Postgres and relay binary. Run through bench/kafka/run.sh --eos.

  drain: 200,000 pending events (bench/sink_drains.py's seed and timed drain), alternating
         at-least-once / exactly-once for --rounds rounds, median; the ratio eos / alo (target
         >= 0.7). Each drain is checked: every event in the topic once, as a read_committed
         consumer sees it. The broker's CPU (utime+stime of its JVM) per event of each drain.
  --relay-bin-old B: also an exactly-once drain with binary B in each round (mode old-eos<N>, the
         first of --eos-batch-sizes), and the ratio of the two exactly-once drains: a before/after
         in one run, each beside the same at-least-once reference.
  steady: --latency-rate events/s for --latency-seconds from 8 writers into an idle relay; a
         consumer (isolation.level=read_committed) reads the topic live; commit-to-consumer per
         event = when the consumer got it - when the writer's COMMIT returned (same machine's
         clock), after a warm-up; p50/p99 (target p99 <= 25 ms for exactly once). Broker CPU per
         event of the steady run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from pgcost import process_cpu_seconds  # noqa: E402
from sink_drains import pct, seed, sql, steady_writers, timed_drain  # noqa: E402


def log(msg):
    print(f"[eos-cost] {msg}", file=sys.stderr, flush=True)


class Run:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.broker_pid = int(Path(a.broker_pid_file).read_text())

    def broker_cpu(self):
        return process_cpu_seconds(self.broker_pid)

    def create_topic(self, name, config=None):
        admin = AdminClient({"bootstrap.servers": self.a.brokers})
        admin.create_topics([NewTopic(name, num_partitions=self.a.partitions, replication_factor=1,
                                      config=config or {})])[name].result(timeout=30)
        time.sleep(0.5)

    def batch_size(self, mode):
        """alo: --batch-size; eos<N> (or old-eos<N>): N (eos alone: --batch-size); eosdefault:
        None, relay.batch_size left out (the relay's default for an exactly-once sink)."""
        mode = mode.removeprefix("old-")
        if mode == "eosdefault":
            return None
        return int(mode[3:]) if mode.startswith("eos") and mode[3:] else self.a.batch_size

    def sink(self, mode, topic):
        s = {"name": "kafka", "type": "kafka", "brokers": self.a.brokers, "topic": topic}
        if mode.removeprefix("old-").startswith("eos"):
            s.update({"exactly_once": True, "transactional_id": "bench-eos-" + uuid.uuid4().hex[:8]})
            if self.a.eos_properties:
                s["properties"] = dict(kv.split("=", 1) for kv in self.a.eos_properties.split(";"))
        return s

    def committed_ids(self, topic, timeout=180):
        """outbox-ids of every message a read_committed consumer sees, up to the last stable offset."""
        c = Consumer({"bootstrap.servers": self.a.brokers, "group.id": "eos-cost-" + uuid.uuid4().hex[:6],
                      "isolation.level": "read_committed", "enable.partition.eof": True,
                      "enable.auto.commit": False})
        try:
            parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
            stable = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
            done = {p for p in parts if stable[p] == 0}
            ids = []
            deadline = time.monotonic() + timeout
            while len(done) < len(parts) and time.monotonic() < deadline:
                for m in c.consume(num_messages=10000, timeout=0.5):
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= stable[m.partition()]:
                            done.add(m.partition())
                        continue
                    ids.append(int(dict(m.headers())["outbox-id"]))
            return ids
        finally:
            c.close()

    def drain(self, mode, rnd):
        seed(self.a.url, self.a.events)
        topic = f"bench.eos.drain.{mode}.{rnd}"
        self.create_topic(topic)
        cpu0 = self.broker_cpu()
        relay_bin = self.a.relay_bin_old if mode.startswith("old-") else self.a.relay_bin
        r = timed_drain(self.a.url, relay_bin, self.work, mode, self.sink(mode, topic), self.a.events,
                        self.batch_size(mode), self.logs / f"relay-drain-{mode}-{rnd}.log",
                        log_level=self.a.relay_log_level)
        cpu1 = self.broker_cpu()
        ids = self.committed_ids(topic)
        r["in_topic"] = len(ids)
        r["duplicates"] = len(ids) - len(set(ids))
        r["valid"] = r["valid"] and len(set(ids)) == self.a.events
        r["broker_cpu_us_per_event"] = round((cpu1 - cpu0) * 1e6 / self.a.events, 2)
        return r

    def steady(self, mode):
        seed(self.a.url, self.a.events)
        sql(self.a.url, "UPDATE outbox_events SET processed_at = created_at")
        sql(self.a.url, "VACUUM ANALYZE outbox_events")
        sql(self.a.url, "CHECKPOINT")
        topic = f"bench.eos.steady.{mode}.{int(time.time())}"
        self.create_topic(topic)
        relay = {} if self.batch_size(mode) is None else {"batch_size": self.batch_size(mode)}
        cfg = {"database": {"url": self.a.url}, "relay": relay,
               "http": {"enabled": False}, "log": {"level": self.a.relay_log_level},
               "sinks": [self.sink(mode, topic)]}
        path = self.work / f"steady-{mode}.yaml"
        path.write_text(json.dumps(cfg))
        # The consumer is a process of its own (not a thread beside the writers: the GIL would
        # delay what it reads); it writes "id receive-time" lines.
        seen_path = self.work / f"steady-{mode}.seen"
        reader = subprocess.Popen([sys.executable, __file__, "--consume", self.a.brokers, topic, str(seen_path),
                                   str(self.a.consumer_fetch_wait_ms)])
        time.sleep(2)
        n = len(list(self.logs.glob(f"relay-steady-{mode}*.log")))
        with open(self.logs / f"relay-steady-{mode}{'-' + str(n + 1) if n else ''}.log", "w") as lf:
            relay = subprocess.Popen([self.a.relay_bin, "run", "--config", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=lf)
            try:
                time.sleep(3)  # connects, takes its lanes over, goes idle (not a correctness wait)
                cpu0 = self.broker_cpu()
                committed = steady_writers(self.a.url, self.a.latency_rate, self.a.latency_seconds)
                deadline = time.monotonic() + 60
                received = {}
                while time.monotonic() < deadline:
                    received = read_seen(seen_path)
                    if set(committed) <= set(received):
                        break
                    time.sleep(0.5)
                cpu1 = self.broker_cpu()
            finally:
                relay.terminate()
                relay.wait(timeout=30)
                reader.terminate()
                reader.wait(timeout=10)
        first = min(committed.values())
        lat = [(received[i] - t) * 1000 for i, t in committed.items()
               if i in received and t - first >= self.a.latency_warmup]
        missing = len(set(committed) - set(received))
        if self.a.keep_samples:  # a diagnosis: every event's commit and receive time
            (self.logs / f"steady-{mode}.samples.json").write_text(
                json.dumps({i: [t, received.get(i)] for i, t in committed.items()}))
        return {"events": len(committed), "missing_at_consumer": missing,
                "commit_to_consumer_ms": {"p50": round(pct(lat, 0.5), 2), "p99": round(pct(lat, 0.99), 2),
                                          "max": round(max(lat), 2), "samples": len(lat)},
                "broker_cpu_us_per_event": round((cpu1 - cpu0) * 1e6 / max(1, len(committed)), 2)}

    def run(self):
        subprocess.run([self.a.relay_bin, "migrate"], env={"DATABASE_URL": self.a.url, "PATH": "/usr/bin:/bin"},
                       check=True, capture_output=True, timeout=120)
        out = {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip(),
               "config": {k: v for k, v in vars(self.a).items() if k != "url"}, "rounds": []}
        modes = ["alo"] + [f"eos{n}" for n in self.a.eos_batch_sizes.split(",")]
        if self.a.relay_bin_old:
            modes.append("old-" + modes[1])
        log("warm-up: an unmeasured at-least-once and exactly-once drain of 50,000")
        events, self.a.events = self.a.events, 50_000
        for mode in modes[:2]:
            self.drain(mode, 0)
        self.a.events = events
        for i in range(self.a.rounds):
            order = modes if i % 2 == 0 else modes[::-1]
            rnd = {}
            for mode in order:
                log(f"round {i + 1}: {mode} drain of {self.a.events}")
                rnd[mode] = self.drain(mode, i + 1)
                log(f"  {rnd[mode]['rate']:,.0f}/s valid={rnd[mode]['valid']} "
                    f"broker {rnd[mode]['broker_cpu_us_per_event']} us/event")
            out["rounds"].append(rnd)
        med = {m: statistics.median([r[m]["rate"] for r in out["rounds"] if r[m]["valid"]] or [0]) for m in modes}
        out["modes"] = modes
        out["drain_median"] = med
        out["drain_ratio_over_alo"] = {m: round(med[m] / med["alo"], 3) for m in modes[1:]} if med["alo"] else None
        if self.a.relay_bin_old:
            # Per round, then the median: each pair drained minutes apart, in the same VM phase.
            pairs = [r[modes[1]]["rate"] / r[modes[-1]]["rate"] for r in out["rounds"] if r[modes[-1]]["rate"]]
            out["eos_over_old_eos"] = {"median": round(statistics.median(pairs), 3) if pairs else None,
                                       "per_round": [round(x, 3) for x in pairs]}
        out["broker_cpu_us_per_event_drain"] = {
            m: statistics.median([r[m]["broker_cpu_us_per_event"] for r in out["rounds"]] or [0]) for m in modes}
        self.steady_rounds(out, modes[:2])
        return out

    def steady_rounds(self, out, modes):
        """--steady-rounds rounds of the steady run, at-least-once and exactly-once alternating
        (the order flips each round); each mode's p99 median over the rounds."""
        for i in range(self.a.steady_rounds):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                log(f"steady round {i + 1}: {self.a.latency_rate}/s for {self.a.latency_seconds}s: {mode}")
                s = self.steady(mode)
                log(f"  {s}")
                out.setdefault(f"steady_{mode}_rounds", []).append(s)
        for mode in modes if self.a.steady_rounds else []:
            rounds = out[f"steady_{mode}_rounds"]
            out[f"steady_{mode}"] = dict(rounds[len(rounds) // 2]) if len(rounds) == 1 else {
                **rounds[0], "commit_to_consumer_ms": {
                    k: round(statistics.median(r["commit_to_consumer_ms"][k] for r in rounds), 2)
                    for k in ("p50", "p99", "max", "samples")},
                "broker_cpu_us_per_event": round(statistics.median(r["broker_cpu_us_per_event"] for r in rounds), 2),
                "p99_per_round": [r["commit_to_consumer_ms"]["p99"] for r in rounds]}

    def steady_only(self):
        """--steady-only: the steady runs without the drains (a latency diagnosis)."""
        subprocess.run([self.a.relay_bin, "migrate"], env={"DATABASE_URL": self.a.url, "PATH": "/usr/bin:/bin"},
                       check=True, capture_output=True, timeout=120)
        out = {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "config": {k: v for k, v in vars(self.a).items() if k != "url"},
               "modes": self.a.steady_modes.split(",")}
        self.steady_rounds(out, out["modes"])
        return out


def read_seen(path):
    seen = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                seen.setdefault(int(parts[0]), float(parts[1]))
    return seen


def consume(brokers, topic, path, fetch_wait_ms="5"):
    """The steady run's consumer: read_committed, live, one line per message as it arrives."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "eos-steady-" + uuid.uuid4().hex[:6],
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "fetch.wait.max.ms": int(fetch_wait_ms)})
    parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    with open(path, "w", buffering=1) as out:
        while True:
            # poll(), not consume(num_messages=...): consume waits out its timeout to fill the batch.
            m = c.poll(0.05)
            if m is not None and not m.error():
                out.write(f"{dict(m.headers())['outbox-id'].decode()} {time.time():.6f}\n")


def main():
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--consume":
        consume(*sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--broker-pid-file", required=True)
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--relay-bin-old", default="",
                   help="a second relay binary: its exactly-once drain in the same rounds (a before/after)")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--eos-batch-sizes", default="500",
                   help="exactly-once drains at these relay batch sizes (at least once: --batch-size); "
                        "'default': relay.batch_size left out")
    p.add_argument("--eos-properties", default="",
                   help="k=v;... librdkafka properties for the exactly-once sink (a diagnosis, e.g. debug=eos)")
    p.add_argument("--relay-log-level", default="info",
                   help="the relays' log level (debug: a line per Kafka transaction with its timings)")
    p.add_argument("--keep-samples", action="store_true",
                   help="write each steady event's commit and receive time next to the relay logs (a diagnosis)")
    p.add_argument("--consumer-fetch-wait-ms", type=int, default=5,
                   help="the steady consumer's fetch.wait.max.ms (librdkafka's default: 500)")
    p.add_argument("--latency-rate", type=int, default=1000)
    p.add_argument("--latency-seconds", type=int, default=30)
    p.add_argument("--latency-warmup", type=float, default=3.0)
    p.add_argument("--steady-rounds", type=int, default=1,
                   help="steady runs per mode, alternating at-least-once and exactly-once; medians")
    p.add_argument("--steady-only", action="store_true", help="the steady runs alone, no drains")
    p.add_argument("--steady-modes", default="alo,eos",
                   help="--steady-only: these modes (alo, eos<N>, eosdefault), alternating")
    a = p.parse_args()
    r = Run(a).steady_only() if a.steady_only else Run(a).run()
    Path(a.out).write_text(json.dumps(r, indent=1, default=str))
    if not a.steady_only:
        m = r["drain_median"]
        print(f"drain of {a.events} (median, events/s): {m}; over at least once {r['drain_ratio_over_alo']} "
              f"(target >= 0.7); broker CPU us/event {r['broker_cpu_us_per_event_drain']}")
    if "eos_over_old_eos" in r:
        print(f"exactly once, this binary over --relay-bin-old, per round and median: {r['eos_over_old_eos']}")
    for mode in (r["modes"] if a.steady_only else r["modes"][:2]) if a.steady_rounds else []:
        s = r[f"steady_{mode}"]
        c = s["commit_to_consumer_ms"]
        print(f"steady {a.latency_rate}/s {mode}: commit-to-consumer (read_committed) p50 {c['p50']} ms, "
              f"p99 {c['p99']} ms, max {c['max']} ms ({c['samples']} events, {s['missing_at_consumer']} missing); "
              f"broker CPU {s['broker_cpu_us_per_event']} us/event"
              + (f"; p99 per round {s['p99_per_round']}" if "p99_per_round" in s else ""))
    print(f"written: {a.out}")


if __name__ == "__main__":
    main()
