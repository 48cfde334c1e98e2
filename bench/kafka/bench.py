#!/usr/bin/env python3
"""The Kafka sink benchmark (issue 3), run by bench/kafka/run.sh on one throwaway Postgres
cluster (fsync on) and one throwaway Apache Kafka broker, both on this machine.

Drain rounds (200,000 pending events each, default 4 rounds: each system once in each position):
  sql    the SQL-only rate of the relay's own statements (outbox-bench sql-drain --variant relay:
         the relay's PgStore claims and marks, no sink)
  file   the real relay binary, file sink (fsync on)
  kafka  the real relay binary, Kafka sink (idempotent producer, acks=all)
  broker Kafka's own producer ceiling for the same values: org.apache.kafka.tools.ProducerPerformance
         (acks=all, idempotent) with --payload-file holding the seeded payloads
One unmeasured warm-up (a Kafka drain and a ProducerPerformance run) goes first: the broker is a
JVM. Topics have --partitions partitions (default 3: librdkafka sends one ProduceRequest per
partition, and the single broker answers them one after another).
Relay drains are timed like bench/tool relay-drain: from starting the process until the last
row is marked (a primary-key range probe every 2 ms), so the file and Kafka figures compare.

Latency: a steady 1,000 events/s for --latency-seconds (8 writer connections, single-row INSERT
transactions, paced) into an idle relay. Per event, from the moment its writer's COMMIT returned:
  commit-to-ack     the broker's LogAppendTime of its message (topic with
                    message.timestamp.type=LogAppendTime; single broker, so append = ack)
  commit-to-marked  processed_at (now() of the relay's completing transaction, which starts right
                    after the sink acknowledged): for the Kafka and the file sink side by side.

Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from sink_drains import pct, seed, steady_writers, timed_drain  # noqa: E402

BROKER_SH = ROOT / "tests" / "kafka" / "broker.sh"


def log(msg):
    print(f"[bench-kafka {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.env = {**os.environ, "DATABASE_URL": a.url}
        self.admin = AdminClient({"bootstrap.servers": a.brokers})

    # -- helpers -------------------------------------------------------------------------------
    def sql(self, statement, params=None, autocommit=True):
        with psycopg.connect(self.a.url, autocommit=autocommit) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else None

    def create_topic(self, name, partitions, config=None):
        futures = self.admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                     config=config or {})])
        futures[name].result(timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            md = self.admin.list_topics(name, timeout=10).topics.get(name)
            if md and md.error is None and len(md.partitions) == partitions and all(
                    p.leader >= 0 for p in md.partitions.values()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"topic {name} not ready")

    def topic_size(self, topic):
        consumer = Consumer({"bootstrap.servers": self.a.brokers, "group.id": "bench-size"})
        try:
            md = consumer.list_topics(topic, timeout=30).topics[topic]
            return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                       for p in md.partitions)
        finally:
            consumer.close()

    def relay_config(self, name, sink, **relay):
        cfg = {"database": {"url": self.a.url},
               "relay": {"batch_size": self.a.batch_size, **relay},
               "http": {"enabled": False}, "log": {"level": self.a.relay_log_level}, "sinks": [sink]}
        path = self.work / f"{name}.yaml"
        path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
        return path

    def kafka_sink(self, topic_template):
        return {"name": "kafka", "type": "kafka", "brokers": self.a.brokers, "topic": topic_template}

    def file_sink(self, path):
        return {"name": "file", "type": "file", "path": str(path), "fsync": True}

    def seed(self, count):
        seed(self.a.url, count)

    # -- drains --------------------------------------------------------------------------------
    def relay_drain(self, name, sink, rnd):
        return timed_drain(self.a.url, self.a.relay_bin, self.work, name, sink, self.a.events, self.a.batch_size,
                           self.logs / f"relay-drain-{name}-{rnd}.log", self.a.relay_log_level)

    def sql_drain(self):
        p = subprocess.run([self.a.bench_bin, "--url", self.a.url, "sql-drain", "--variant", "relay", "--expect",
                            str(self.a.events), "--batch", str(self.a.batch_size)],
                           capture_output=True, text=True, timeout=900)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if not lines:
            raise RuntimeError(f"sql-drain failed ({p.returncode}): {p.stderr[-2000:]}")
        r = json.loads(lines[-1])
        r["valid"] = p.returncode == 0 and "rate" in r
        return r

    def broker_ceiling(self, rnd):
        topic = f"bench.ceiling.{rnd}"
        self.create_topic(topic, self.a.partitions)
        payloads = self.work / "payloads.txt"
        if not payloads.exists():
            self.seed(self.a.events)
            rows = self.sql("SELECT payload::text FROM outbox_events ORDER BY id")
            payloads.write_text("\n".join(r[0] for r in rows) + "\n")
        p = subprocess.run([str(BROKER_SH), "run-class", "org.apache.kafka.tools.ProducerPerformance",
                            "--topic", topic, "--num-records", str(self.a.events), "--throughput", "-1",
                            "--payload-file", str(payloads), "--producer-props",
                            f"bootstrap.servers={self.a.brokers}", "acks=all", "enable.idempotence=true",
                            "linger.ms=5", "batch.size=1000000", "max.in.flight.requests.per.connection=5"],
                           capture_output=True, text=True, timeout=900)
        line = next((l for l in reversed(p.stdout.splitlines()) if "records sent" in l), None)
        if p.returncode != 0 or line is None:
            raise RuntimeError(f"ProducerPerformance failed ({p.returncode}): {p.stderr[-2000:]}{p.stdout[-2000:]}")
        # "200000 records sent, 43563.5 records/sec (4.15 MB/sec), 1285.84 ms avg latency, ..."
        rate = float(line.split(",")[1].split()[0])
        return {"events": self.a.events, "rate": rate, "summary": line.strip(), "valid": True,
                "in_topic": self.topic_size(topic)}

    def warm_up(self):
        """The broker is a JVM: its first requests run interpreted. One unmeasured Kafka drain and
        one unmeasured ProducerPerformance run bring it (and Postgres' caches) to steady state."""
        n = min(self.a.events, 50_000)
        log(f"warm-up: unmeasured Kafka drain and broker run of {n} events")
        events, self.a.events = self.a.events, n
        try:
            self.seed(n)
            self.create_topic("bench.warmup", self.a.partitions)
            r = self.relay_drain("kafka", self.kafka_sink("bench.warmup"), 0)
            if not r["valid"]:
                raise RuntimeError(f"warm-up drain failed: {r}")
            self.broker_ceiling(0)
        finally:
            self.a.events = events
            (self.work / "payloads.txt").unlink(missing_ok=True)

    def drains(self):
        self.warm_up()
        systems = ["sql", "file", "kafka", "broker"]
        rounds = []
        for i in range(self.a.rounds):
            order = systems[i % len(systems):] + systems[:i % len(systems)]
            rnd = {"round": i + 1, "order": order}
            for system in order:
                log(f"round {i + 1}: {system} drain of {self.a.events} events")
                load_before = round(os.getloadavg()[0], 2)
                if system == "broker":
                    rnd[system] = self.broker_ceiling(i + 1)
                    rnd[system]["loadavg_1m"] = [load_before, round(os.getloadavg()[0], 2)]
                    log(f"  {rnd[system]['rate']:,.0f}/s")
                    continue
                self.seed(self.a.events)
                if system == "sql":
                    rnd[system] = self.sql_drain()
                elif system == "file":
                    sink_path = self.work / "drain-sink.jsonl"
                    sink_path.unlink(missing_ok=True)
                    rnd[system] = self.relay_drain("file", self.file_sink(sink_path), i + 1)
                    lines = sum(1 for _ in open(sink_path)) if sink_path.exists() else 0
                    rnd[system]["lines"] = lines
                    rnd[system]["valid"] = rnd[system]["valid"] and lines == self.a.events
                    sink_path.unlink(missing_ok=True)
                else:
                    topic = f"bench.drain.{i + 1}"
                    self.create_topic(topic, self.a.partitions)
                    rnd[system] = self.relay_drain("kafka", self.kafka_sink(topic), i + 1)
                    in_topic = self.topic_size(topic)
                    rnd[system]["in_topic"] = in_topic
                    # No loss (every event in the topic) and, with no faults, no duplicate either.
                    rnd[system]["valid"] = rnd[system]["valid"] and in_topic == self.a.events
                rnd[system]["loadavg_1m"] = [load_before, round(os.getloadavg()[0], 2)]
                log(f"  {rnd[system].get('rate', 0):,.0f}/s valid={rnd[system]['valid']} "
                    f"(load average {rnd[system]['loadavg_1m']})")
            rounds.append(rnd)
        return rounds

    # -- latency -------------------------------------------------------------------------------
    def steady_writers(self, rate, seconds, threads=8):
        return steady_writers(self.a.url, rate, seconds, threads)

    def latency(self, sink_kind):
        """A steady rate into an idle relay; commit-to-ack percentiles over the events after warmup."""
        # A table like one in service: a history of processed rows, statistics that know it.
        # (Analysing a just-truncated table instead makes the planner cost the claim for an empty
        # table until autovacuum re-analyses it, a minute later: seconds of latency at 1,000/s.)
        self.seed(self.a.events)
        self.sql("UPDATE outbox_events SET processed_at = created_at")
        self.sql("VACUUM ANALYZE outbox_events")
        self.sql("CHECKPOINT")
        history = self.sql("SELECT max(id) FROM outbox_events")[0][0]
        topic = f"bench.latency.{sink_kind}.{int(time.time())}"
        if sink_kind == "kafka":
            self.create_topic(topic, self.a.partitions, {"message.timestamp.type": "LogAppendTime"})
            sink = self.kafka_sink(topic)
        else:
            sink = self.file_sink(self.work / "latency-sink.jsonl")
        cfg = self.relay_config(f"latency-{sink_kind}", sink)
        log_path = self.logs / f"relay-latency-{sink_kind}.log"
        with open(log_path, "w") as log_file:
            relay = subprocess.Popen([self.a.relay_bin, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL,
                                     stderr=log_file)
            try:
                time.sleep(2)  # the relay connects, takes its lanes and goes idle (not a correctness wait)
                committed = self.steady_writers(self.a.latency_rate, self.a.latency_seconds)
                deadline = time.monotonic() + 60
                while self.sql("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")[0][0] > 0:
                    if time.monotonic() > deadline:
                        raise RuntimeError("latency run: events left unprocessed")
                    time.sleep(0.1)
            finally:
                relay.terminate()
                relay.wait(timeout=30)
        rows = self.sql("SELECT id, extract(epoch FROM processed_at), extract(epoch FROM created_at) "
                        "FROM outbox_events WHERE id > %s ORDER BY id", (history,))
        first = min(committed.values())
        # After the warmup only; commit time = when the writer's COMMIT returned (client clock, same
        # machine as Postgres and Kafka).
        measured = {r[0]: (float(r[1]), float(r[2])) for r in rows if committed[r[0]] - first >= self.a.latency_warmup}
        marked_ms = [(processed - committed[oid]) * 1000 for oid, (processed, _) in measured.items()]
        insert_to_commit_ms = [(committed[oid] - created) * 1000 for oid, (_, created) in measured.items()]
        span = max(committed.values()) - first

        def summary(values):
            return {"p50": round(pct(values, 0.5), 2), "p99": round(pct(values, 0.99), 2),
                    "max": round(max(values), 2), "samples": len(values)}

        out = {"events": len(rows), "offered_rate": self.a.latency_rate,
               "achieved_rate": round(len(rows) / span, 1) if span > 0 else None,
               "loadavg_1m_after": round(os.getloadavg()[0], 2),
               "commit_to_marked_ms": summary(marked_ms),
               "writer_insert_to_commit_ms": summary(insert_to_commit_ms)}
        if sink_kind == "kafka":
            acked_ms = []
            for m in self.read_all(topic):
                oid = int(dict(m.headers())["outbox-id"])
                if oid in measured:
                    acked_ms.append(m.timestamp()[1] - committed[oid] * 1000)
            out["commit_to_ack_ms"] = summary(acked_ms)
            out["in_topic"] = self.topic_size(topic)
        return out

    def read_all(self, topic):
        consumer = Consumer({"bootstrap.servers": self.a.brokers, "group.id": "bench-read",
                             "enable.auto.commit": False})
        try:
            md = consumer.list_topics(topic, timeout=30).topics[topic]
            high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in md.partitions}
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
            nxt = {p: 0 for p in md.partitions}
            out = []
            deadline = time.monotonic() + 120
            while any(nxt[p] < high[p] for p in nxt) and time.monotonic() < deadline:
                for m in consumer.consume(num_messages=10000, timeout=0.5):
                    if m.error() or m.offset() >= high[m.partition()]:
                        continue
                    nxt[m.partition()] = m.offset() + 1
                    out.append(m)
            return out
        finally:
            consumer.close()

    # -- all -----------------------------------------------------------------------------------
    def run(self):
        subprocess.run([self.a.relay_bin, "migrate"], env=self.env, check=True, capture_output=True, timeout=120)
        result = {"meta": self.meta(), "config": {k: v for k, v in vars(self.a).items() if k not in ("url",)}}
        result["drain_rounds"] = self.drains() if self.a.rounds > 0 else []
        summary = {}
        for system in ("sql", "file", "kafka", "broker"):
            rates = [r[system]["rate"] for r in result["drain_rounds"] if r[system].get("valid")]
            summary[system] = {"median_rate": round(statistics.median(rates), 1) if rates else None,
                               "rates": rates}
        ceiling = min(summary["sql"]["median_rate"] or 0, summary["broker"]["median_rate"] or 0)
        kafka = summary["kafka"]["median_rate"] or 0
        summary["kafka_over_min_sql_broker"] = round(kafka / ceiling, 3) if ceiling else None
        summary["kafka_over_file"] = round(kafka / summary["file"]["median_rate"], 3) if summary["file"][
            "median_rate"] else None
        summary["target_0_6_met"] = bool(ceiling) and kafka / ceiling >= 0.6
        # The same ratio within each round (the four figures of a round ran back to back).
        summary["kafka_over_min_sql_broker_per_round"] = [
            round(r["kafka"]["rate"] / min(r["sql"]["rate"], r["broker"]["rate"]), 3)
            for r in result["drain_rounds"]
            if all(r[k].get("valid") for k in ("sql", "kafka", "broker"))]
        result["drain_summary"] = summary
        log(f"latency: {self.a.latency_rate}/s for {self.a.latency_seconds}s, kafka sink")
        result["latency_kafka"] = self.latency("kafka")
        log(f"latency: {self.a.latency_rate}/s for {self.a.latency_seconds}s, file sink")
        result["latency_file"] = self.latency("file")
        result["meta"]["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return result

    def meta(self):
        def out(cmd):
            try:
                return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
            except OSError:
                return None
        return {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "git": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
                "git_dirty": bool(out(["git", "-C", str(ROOT), "status", "--porcelain", "--", "relay", "bench/kafka"])),
                "nproc": os.cpu_count(),
                "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                            None),
                "postgres": self.sql("SHOW server_version")[0][0],
                "postgres_fsync": self.sql("SHOW fsync")[0][0],
                "kafka": out([str(BROKER_SH), "fetch"]).rsplit("-", 1)[-1],
                "relay": out([self.a.relay_bin, "--version"]),
                "librdkafka": out(["pkg-config", "--modversion", "rdkafka"])}


def table(r):
    s = r["drain_summary"]
    lines = ["", "drain of %d pending events (median of %d rounds, events/s):" % (r["config"]["events"],
                                                                                 r["config"]["rounds"])]
    for system, label in (("sql", "SQL-only (relay statements, no sink)"), ("file", "relay, file sink (fsync)"),
                          ("kafka", "relay, Kafka sink (acks=all, idempotent)"),
                          ("broker", "broker ceiling (ProducerPerformance)")):
        lines.append(f"  {label:45s} {s[system]['median_rate'] or 0:>10,.0f}   rounds: {s[system]['rates']}")
    lines.append(f"  kafka / min(sql, broker) = {s['kafka_over_min_sql_broker']}  (target >= 0.6: "
                 f"{'met' if s['target_0_6_met'] else 'NOT met'}; per round {s.get('kafka_over_min_sql_broker_per_round')})"
                 f";  kafka / file = {s['kafka_over_file']}")
    for kind in ("kafka", "file"):
        lat = r[f"latency_{kind}"]
        m = lat["commit_to_marked_ms"]
        lines.append(f"{kind} sink at {lat['offered_rate']}/s (achieved {lat['achieved_rate']}/s, "
                     f"{m['samples']} events measured, load average {lat['loadavg_1m_after']}):")
        if kind == "kafka":
            a = lat["commit_to_ack_ms"]
            lines.append(f"  commit-to-ack (broker append)  p50 {a['p50']} ms, p99 {a['p99']} ms")
        lines.append(f"  commit-to-marked               p50 {m['p50']} ms, p99 {m['p99']} ms")
        w = lat["writer_insert_to_commit_ms"]
        lines.append(f"  (writers' own INSERT+COMMIT    p50 {w['p50']} ms, p99 {w['p99']} ms)")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--bench-bin", required=True)
    p.add_argument("--work", default=tempfile.mkdtemp(prefix="bench-kafka-"))
    p.add_argument("--out", required=True)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="drain rounds (0: latency only)")
    p.add_argument("--latency-rate", type=int, default=1000)
    p.add_argument("--latency-seconds", type=int, default=30)
    p.add_argument("--latency-warmup", type=float, default=3.0)
    p.add_argument("--relay-log-level", default="info", help="debug logs one line per Kafka batch (diagnosis)")
    a = p.parse_args()
    r = Bench(a).run()
    Path(a.out).write_text(json.dumps(r, indent=1, default=str))
    print(table(r))
    print(f"\nwritten: {a.out}")


if __name__ == "__main__":
    main()
