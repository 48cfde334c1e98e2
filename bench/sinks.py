#!/usr/bin/env python3
"""Every sink beside its broker's own benchmark tool and the file sink, in one run (issue 30,
points 1 and 3). Run by bench/sinks.sh on one throwaway Postgres cluster (fsync on); this script
starts the brokers of the sinks asked for, each as the tests and the sink benchmarks do
(tests/kafka/broker.sh, nats-server with JetStream file storage, tests/integration/
rabbitmq_fixtures.py, redis-server with appendfsync always, bench/webhook/receiver).

Drain rounds (--rounds, default 3; per sink, its systems in an order that rotates per round):
  sink  the real relay binary draining --events pending events (bench/sink_drains.py's seed:
        ~150-byte payloads, 10,000 keys) to the sink, timed from the process start until the
        last row is marked; valid only if the broker then holds exactly --events messages
  tool  the broker's own benchmark tool publishing --events messages of the same size with the
        same guarantees (see TOOLS below); its own reported rate
  file  the relay draining the same backlog to the file sink (fsync on)
  old   (--relay-bin-old; the rabbitmq row and --compare-sinks) the same drain by an older binary
  old_file (with old) the file drain by the older binary, so a change to the loop is seen on the
        file sink too, in the same run ("file new/old" in the JSON and the log)
Each figure comes with the CPU the machine spent meanwhile outside Postgres, the broker, the
measured processes and this script: "foreign load", in cores.

Steady (--steady, default on): per sink, 8 writers committing single events at --steady-rate
(1,000/s) for --steady-seconds (30 s) into an idle relay; per event, from its writer's COMMIT
returning to its arrival at a consumer of the broker (p50, p99; after --steady-warmup s), and
the broker's own CPU (utime+stime of its process tree in /proc) per event over the run, the
consumer's reads included; also net of the broker's idle CPU, measured for
--steady-idle-seconds (5 s) just before, with the relay and the consumer attached. Kafka also
gives commit-to-ack (the broker's LogAppendTime), as bench/kafka/bench.py does.

--broker-own-core (a diagnosis, not the benchmark): each broker, the webhook receiver too, pinned
to CPU 1 once started; Postgres, this script and what it starts (the relay, the tools) to CPU 0.
The broker then takes none of the cores the relay and Postgres use, as on its own host.

Kafka diagnosis (issue 45): --kafka-variants adds more kafka drains per round (their own sink
properties or batch_size; file drains and ProducerPerformance runs with other settings too),
--kafka-batches counts the record batches each run left in the broker (DumpLogSegments, outside
the CPU window), --kafka-jfr records the broker with JFR; every CPU window also splits the broker's
CPU by thread name (request handlers, network threads, the JIT's compiler threads, GC).

Prints a table and writes one JSON file (--out)."""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from sink_drains import file_drain, pct, proc_stat, seed, sql, steady_writers, timed_drain  # noqa: E402

BROKER_SH = ROOT / "tests" / "kafka" / "broker.sh"
HZ = os.sysconf("SC_CLK_TCK")
SINKS = ("kafka", "nats", "rabbitmq", "redis", "webhook")


def log(msg):
    print(f"[bench-sinks {dt.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def summary_ms(values):
    if not values:
        return {"samples": 0}
    return {"p50": round(pct(values, 0.5), 2), "p99": round(pct(values, 0.99), 2), "max": round(max(values), 2),
            "samples": len(values)}


def run_out(cmd, timeout=900, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {p.stderr[-2000:]}{p.stdout[-2000:]}")
    return p.stdout


# -- CPU accounting ---------------------------------------------------------------------------

def all_stats():
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = proc_stat(entry)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                pass
    return out


def tree_pids(root, stats):
    """root and every live descendant of it, by the parents in stats."""
    children = {}
    for pid, g in stats.items():
        children.setdefault(int(g[1]), []).append(pid)
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            yield pid
            todo.extend(children.get(pid, []))


def tree_cpu_seconds(root, stats=None):
    """utime+stime of root and every live descendant (the broker: a JVM, an Erlang VM under its
    start script, a Go or C server), and cutime+cstime: the children they reaped (Redis' AOF
    rewrite is a fork)."""
    stats = stats or all_stats()
    return sum(sum(int(x) for x in stats[pid][11:15]) for pid in tree_pids(root, stats)) / HZ


def postgres_cpu_seconds(postmaster, stats):
    """The postmaster, the backends it reaped (cutime/cstime) and every live backend."""
    g = stats.get(postmaster)
    total = sum(int(x) for x in g[11:15]) if g else 0
    total += sum(int(s[11]) + int(s[12]) for pid, s in stats.items() if int(s[1]) == postmaster)
    return total / HZ


def pin_tree(root, cpus):
    """Every thread of root and of its live descendants onto cpus (threads and processes they
    start later inherit it)."""
    for pid in tree_pids(root, all_stats()):
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
        except (FileNotFoundError, ProcessLookupError):
            pass  # gone meanwhile


def machine_busy_seconds():
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = [int(x) for x in f.readline().split()[1:9]]
    return (user + nice + system + irq + softirq + steal) / HZ


def own_cpu_seconds():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


class CpuWindow:
    """CPU used during one measurement: Postgres, the broker (its process tree), the measured
    processes (the relay or the tool: reaped children of this script), this script, and foreign
    load (everything else on the machine: other work on these 2 cores)."""

    def __init__(self, postmaster, broker_pid):
        self.postmaster, self.broker_pid = postmaster, broker_pid

    def threads(self):
        """The broker's CPU seconds per thread name (/proc/<pid>/task/*/stat: a JVM's threads, the
        name cut to 15 characters, numbers dropped so a pool counts as one)."""
        out = {}
        try:
            tids = os.listdir(f"/proc/{self.broker_pid}/task")
        except (FileNotFoundError, ProcessLookupError):
            return out
        for tid in tids:
            try:
                with open(f"/proc/{self.broker_pid}/task/{tid}/stat") as f:
                    raw = f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            name = re.sub(r"[0-9#-]+$", "", raw[raw.index("(") + 1:raw.rindex(")")]).strip()
            g = raw[raw.rindex(")") + 2:].split()
            out[name] = out.get(name, 0.0) + (int(g[11]) + int(g[12])) / HZ
        return out

    def snapshot(self):
        stats = all_stats()
        me, children = own_cpu_seconds()
        return {"t": time.monotonic(), "machine": machine_busy_seconds(),
                "pg": postgres_cpu_seconds(self.postmaster, stats),
                "broker": tree_cpu_seconds(self.broker_pid, stats) if self.broker_pid else 0.0,
                "me": me, "children": children}

    def __enter__(self):
        time.sleep(0.05)  # let exited backends of the previous step be reaped
        self.a = self.snapshot()
        self.threads_a = self.threads() if self.broker_pid else {}
        return self

    def __exit__(self, *exc):
        time.sleep(0.05)
        b = self.snapshot()
        d = {k: b[k] - self.a[k] for k in b}
        threads_b = self.threads() if self.broker_pid else {}
        foreign = max(0.0, d["machine"] - d["pg"] - d["broker"] - d["me"] - d["children"])
        self.result = {"wall_seconds": round(d["t"], 3), "postgres_cpu_seconds": round(d["pg"], 2),
                       "broker_cpu_seconds": round(d["broker"], 2), "measured_cpu_seconds": round(d["children"], 2),
                       "foreign_cpu_seconds": round(foreign, 2),
                       "foreign_cores": round(foreign / d["t"], 2) if d["t"] > 0 else None}
        if threads_b:
            deltas = {k: v - self.threads_a.get(k, 0.0) for k, v in threads_b.items()}
            self.result["broker_threads_cpu_seconds"] = {
                k: round(v, 2) for k, v in sorted(deltas.items(), key=lambda kv: -kv[1]) if v >= 0.01}
        return False


# -- brokers ----------------------------------------------------------------------------------
# Each: start(), stop(), pid (the root of its process tree), sink(tag) -> a relay sink entry
# publishing into a fresh destination, count(tag), drop(tag), tool(tag) -> {rate, valid, ...},
# and consume(tag) -> a Consumer for the steady part.

class Consumer:
    """Arrival times (time.time()) per outbox id, read by a thread while the steady run goes."""

    def __init__(self):
        self.arrivals, self.extra, self.errors = {}, {}, []
        self.stop_event = threading.Event()
        self.thread = None

    def start(self, fn):
        def run():
            try:
                fn()
            except Exception as e:  # reported in the result; a consumer that dies invalidates the latency
                self.errors.append(repr(e))
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait_for(self, ids, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ids <= self.arrivals.keys() and not self.errors:
            time.sleep(0.1)

    def close(self):
        self.stop_event.set()
        if self.thread:
            self.thread.join(timeout=30)


class Kafka:
    name = "kafka"

    def __init__(self, a, work):
        self.a, self.dir = a, work / "kafka"

    def start(self):
        from confluent_kafka.admin import AdminClient
        self.brokers = run_out([str(BROKER_SH), "start", str(self.dir)], timeout=300).strip()
        self.pid = int((self.dir / "pid").read_text())
        self.admin = AdminClient({"bootstrap.servers": self.brokers})
        self.version = run_out([str(BROKER_SH), "fetch"]).strip().rsplit("-", 1)[-1]

    def stop(self):
        self.admin = None  # its handle would log reconnect attempts to the stopped broker
        subprocess.run([str(BROKER_SH), "stop", str(self.dir)], timeout=60)

    def create_topic(self, name, config=None):
        from confluent_kafka.admin import NewTopic
        self.admin.create_topics([NewTopic(name, num_partitions=self.a.kafka_partitions, replication_factor=1,
                                           config=config or {})])[name].result(timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            md = self.admin.list_topics(name, timeout=10).topics.get(name)
            if md and md.error is None and len(md.partitions) == self.a.kafka_partitions and all(
                    p.leader >= 0 for p in md.partitions.values()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"topic {name} not ready")

    def sink(self, tag, steady=False):
        topic = f"bench.{tag}"
        self.create_topic(topic, {"message.timestamp.type": "LogAppendTime"} if steady else None)
        entry = {"name": "kafka", "type": "kafka", "brokers": self.brokers, "topic": topic}
        if self.a.kafka_properties:
            entry["properties"] = json.loads(self.a.kafka_properties)
        return entry

    def batches(self, tag):
        """The record batches the broker holds for bench.<tag> (kafka.tools.DumpLogSegments over
        each partition's log): batches, records and bytes; librdkafka sends one produce request
        per partition's batch, so batches are also its produce requests."""
        n = records = size = 0
        for d in sorted((self.dir / "data").glob(f"bench.{tag}-*")):
            files = sorted(str(f) for f in d.glob("*.log"))
            if not files:
                continue
            out = run_out([str(BROKER_SH), "run-class", "kafka.tools.DumpLogSegments", "--files", ",".join(files)])
            for line in out.splitlines():
                m = re.search(r"\bcount: (\d+) .*\bsize: (\d+)", line)
                if line.startswith("baseOffset") and m:
                    n += 1
                    records += int(m.group(1))
                    size += int(m.group(2))
        return {"batches": n, "records": records, "records_per_batch": round(records / n, 1) if n else None,
                "bytes_per_record": round(size / records, 1) if records else None}

    def jfr_start(self, name):
        if self.a.kafka_jfr:
            run_out(["jcmd", str(self.pid), "JFR.start", f"name={name}", f"settings={self.a.kafka_jfr_settings}",
                     f"filename={Path(self.a.kafka_jfr) / (name + '.jfr')}"])

    def jfr_stop(self, name):
        if self.a.kafka_jfr:
            run_out(["jcmd", str(self.pid), "JFR.stop", f"name={name}"])

    def count(self, tag):
        from confluent_kafka import Consumer as KConsumer, TopicPartition
        topic = f"bench.{tag}"
        c = KConsumer({"bootstrap.servers": self.brokers, "group.id": "bench-size"})
        try:
            md = c.list_topics(topic, timeout=30).topics[topic]
            return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in md.partitions)
        finally:
            c.close()

    def drop(self, tag):
        self.admin.delete_topics([f"bench.{tag}"])[f"bench.{tag}"].result(timeout=60)

    def tool(self, tag, payloads, extra_props=""):
        """ProducerPerformance (kafka-producer-perf-test) with acks=all and idempotence, the
        seeded payloads (--payload-file), into a topic with the drain's partitions; the producer
        settings are bench/kafka/bench.py's broker ceiling."""
        self.create_topic(f"bench.{tag}")
        cmd = [str(BROKER_SH), "run-class", "org.apache.kafka.tools.ProducerPerformance", "--topic", f"bench.{tag}",
               "--num-records", str(self.a.events), "--throughput", "-1", "--payload-file", str(payloads["lines"]),
               "--producer-props", f"bootstrap.servers={self.brokers}", "acks=all", "enable.idempotence=true",
               "linger.ms=5", "batch.size=1000000", "max.in.flight.requests.per.connection=5"]
        cmd += shlex.split(self.a.kafka_tool_props) + shlex.split(extra_props)
        self.jfr_start(tag)
        try:
            out = run_out(cmd)
        finally:
            self.jfr_stop(tag)
        line = next((x for x in reversed(out.splitlines()) if "records sent" in x), None)
        # "200000 records sent, 43563.5 records/sec (4.15 MB/sec), 1285.84 ms avg latency, ..."
        rate = float(line.split(",")[1].split()[0])
        n = self.count(tag)
        return {"rate": rate, "summary": line.strip(), "in_broker": n, "valid": n == self.a.events,
                "command": " ".join(cmd[1:]), "_tag": tag}  # measure() drops it

    def consume(self, tag):
        from confluent_kafka import Consumer as KConsumer, OFFSET_BEGINNING, TopicPartition
        topic, c = f"bench.{tag}", Consumer()
        kc = KConsumer({"bootstrap.servers": self.brokers, "group.id": f"bench-steady-{tag}",
                        "enable.auto.commit": False, "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
        md = kc.list_topics(topic, timeout=30).topics[topic]
        kc.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
        c.extra["log_append_ms"] = {}

        def loop():
            try:
                while not c.stop_event.is_set():
                    m = kc.poll(timeout=0.1)  # one message: returns as soon as one arrived
                    if m is None or m.error():
                        continue
                    now = time.time()
                    oid = int(dict(m.headers())["outbox-id"])
                    c.arrivals[oid] = now
                    c.extra["log_append_ms"][oid] = m.timestamp()[1]
            finally:
                kc.close()
        c.start(loop)
        return c


class Nats:
    name = "nats"

    def __init__(self, a, work):
        self.a, self.dir = a, work / "nats"

    def start(self):
        from conftest import free_ports
        self.port = free_ports(1)[0]
        self.url = f"nats://127.0.0.1:{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
                                      str(self.dir / "store"), "-l", str(self.dir / "server.log")])
        self.pid = self.proc.pid
        self.version = run_out(["nats-server", "--version"]).strip()
        self.js_call(lambda js: js.account_info())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    async def _with_js(self, fn):
        import nats
        deadline = time.monotonic() + 30
        while True:
            try:
                nc = await nats.connect(self.url, connect_timeout=2, allow_reconnect=False)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        try:
            return await fn(nc.jetstream())
        finally:
            await nc.close()

    def js_call(self, fn):
        return asyncio.run(self._with_js(fn))

    def sink(self, tag, steady=False):
        from nats.js.api import StreamConfig
        self.js_call(lambda js: js.add_stream(StreamConfig(name=f"BENCH_{tag}", subjects=[f"bench.{tag}.>"])))
        return {"name": "nats", "type": "nats", "url": self.url, "subject": f"bench.{tag}.{{topic}}",
                "max_in_flight": self.a.nats_in_flight}

    def count(self, tag):
        async def n(js):
            return (await js.stream_info(f"BENCH_{tag}")).state.messages
        return self.js_call(n)

    def drop(self, tag):
        self.js_call(lambda js: js.delete_stream(f"BENCH_{tag}"))

    def tool(self, tag, payloads, extra_props=""):
        """nats bench js pub async: JetStream publishes acknowledged asynchronously, --batch
        outstanding at most (the sink's max_in_flight), a message id per message (the sink sets
        Nats-Msg-Id), into a file-storage stream it creates; one seeded payload as the body."""
        cmd = [self.a.nats_cli, "-s", self.url, "bench", "js", "pub", "async", f"bench.{tag}.order.paid",
               "--stream", f"BENCH_{tag}", "--create", "--storage", "file", "--batch", str(self.a.nats_in_flight),
               "--dedup", "--msgs", str(self.a.events), "--payload", str(payloads["one"]), "--no-progress"]
        out = run_out(cmd)
        text = re.sub(r"\x1b\[[0-9;]*m", "", out)
        m = re.search(r"([\d,]+) msgs/sec", text)
        rate = float(m.group(1).replace(",", "")) if m else None
        # The stream it created takes bench.{tag}.order.paid only: count it as the sink's.
        n = self.count(tag)
        self.drop(tag)
        return {"rate": rate, "summary": " ".join(l.strip() for l in text.splitlines() if "msgs/sec" in l)[:400],
                "in_broker": n, "valid": rate is not None and n == self.a.events, "command": " ".join(cmd)}

    def consume(self, tag):
        c = Consumer()
        ready = threading.Event()

        async def main():
            import nats
            nc = await nats.connect(self.url)
            js = nc.jetstream()

            async def on_msg(msg):
                c.arrivals[int(msg.headers["outbox-id"])] = time.time()

            # A JetStream consumer: a message arrives after the stream stored it.
            sub = await js.subscribe(f"bench.{tag}.>", ordered_consumer=True, cb=on_msg)
            ready.set()
            while not c.stop_event.is_set():
                await asyncio.sleep(0.05)
            await sub.unsubscribe()
            await nc.close()
        c.start(lambda: asyncio.run(main()))
        ready.wait(timeout=30)
        return c


class Rabbitmq:
    name = "rabbitmq"

    def __init__(self, a, work):
        self.a, self.work = a, work

    def start(self):
        from rabbitmq_fixtures import RabbitServer
        self.server = RabbitServer(Path(tempfile.mkdtemp(prefix="rabbit-", dir=self.work)))
        self.server.start()
        self.pid = self.server.proc.pid
        self.version = run_out(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"]).strip()

    def stop(self):
        self.server.stop()

    def sink(self, tag, steady=False):
        # One durable classic queue bound to a topic exchange (bench/rabbitmq/bench.py's).
        self.server.declare(f"bench-{tag}", f"bench-{tag}", "order.#")
        return {"name": "rabbitmq", "type": "rabbitmq", "url": self.server.url, "exchange": f"bench-{tag}",
                "max_in_flight": self.a.rabbitmq_in_flight}

    def count(self, tag):
        conn = self.server.connection()
        try:
            return conn.channel().queue_declare(f"bench-{tag}", durable=True, passive=True).method.message_count
        finally:
            conn.close()

    def drop(self, tag):
        conn = self.server.connection()
        try:
            ch = conn.channel()
            ch.queue_delete(f"bench-{tag}")
            ch.exchange_delete(f"bench-{tag}")
        finally:
            conn.close()

    def tool(self, tag, payloads, extra_props=""):
        """PerfTest: one producer, no consumer, publisher confirms with at most the sink's
        max_in_flight unconfirmed, persistent and mandatory messages of the seeded payloads' mean
        size, into the same kind of exchange and durable classic queue as the sink (predeclared
        here). Each message carries the sink's envelope (content type, app id, message id and the
        four outbox-* headers, with a median row's values): without it the broker spends ~25 %
        less CPU per message and PerfTest publishes ~1.3x faster than it does with the sink's
        messages (bench/RESULTS.md, "The tools with the sinks' messages"). Only the timestamp
        property is left out (8 bytes; PerfTest does not take a number for it)."""
        self.server.declare(f"bench-{tag}", f"bench-{tag}", "order.#")
        env = payloads["envelope"]
        props = ",".join(f"{k}={v}" for k, v in (
            ("contentType", "application/json"), ("appId", "outbox-relay"), ("messageId", env["id"]),
            ("outbox-id", env["id"]), ("outbox-topic", env["topic"]), ("outbox-key", env["key"]),
            ("outbox-created-at", env["created_at"])))
        cmd = ["java", "-Xmx1g", "-cp", f"{self.a.perf_test_lib}/*", "com.rabbitmq.perf.PerfTest",
               "--uri", self.server.url.rstrip("/"), "--producers", "1", "--consumers", "0",
               "--confirm", str(self.a.rabbitmq_in_flight), "--flag", "persistent", "--flag", "mandatory",
               "--message-properties", props, "--predeclared",
               "--exchange", f"bench-{tag}", "--type", "topic", "--routing-key", "order.paid",
               "--queue", f"bench-{tag}", "--auto-delete", "false", "--pmessages", str(self.a.events),
               "--size", str(payloads["mean_size"])]
        out = run_out(cmd)
        m = re.search(r"sending rate avg: ([\d.]+) msg/s", out)
        n = self.count(tag)
        self.drop(tag)
        return {"rate": float(m.group(1)) if m else None,
                "summary": next((l.strip() for l in out.splitlines() if "sending rate avg" in l), out[-300:]),
                "in_broker": n, "valid": bool(m) and n == self.a.events, "command": " ".join(cmd)}

    def consume(self, tag):
        c = Consumer()
        conn = self.server.connection()
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)

        def loop():
            try:
                for method, props, _body in ch.consume(f"bench-{tag}", auto_ack=True, inactivity_timeout=0.1):
                    if method is not None:
                        c.arrivals[int(props.message_id)] = time.time()
                    if c.stop_event.is_set():
                        break
                ch.cancel()
            finally:
                conn.close()
        c.start(loop)
        return c


class Redis:
    name = "redis"

    def __init__(self, a, work):
        self.a, self.dir = a, work / "redis"

    def start(self):
        import redis
        from conftest import free_ports
        self.port = free_ports(1)[0]
        self.dir.mkdir(parents=True, exist_ok=True)
        # bench/redis/run.sh's server: an acknowledged XADD is on disk, as the file sink's lines.
        # No automatic AOF rewrite: it starts when the file has doubled, in whichever run that
        # happens to be (a fork rewriting while every XADD waits for its fsync: seen to cut
        # redis-benchmark from ~80,000 to ~15,000/s in one run and not in the next).
        self.proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir",
                                      str(self.dir), "--logfile", str(self.dir / "redis.log"), "--daemonize", "no",
                                      "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                                      "--auto-aof-rewrite-percentage", "0", "--protected-mode", "no"])
        self.pid = self.proc.pid
        self.redis = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.redis.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.version = self.redis.info("server")["redis_version"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def sink(self, tag, steady=False):
        return {"name": "redis", "type": "redis", "url": f"redis://127.0.0.1:{self.port}", "stream": f"bench.{tag}"}

    def count(self, tag):
        return self.redis.xlen(f"bench.{tag}")

    def drop(self, tag):
        self.redis.delete(f"bench.{tag}")

    def tool(self, tag, payloads, extra_props=""):
        """redis-benchmark: XADD with the sink's fields (id, topic, key, payload, headers,
        created_at) and a seeded payload, one connection, -P the relay's batch_size (the sink
        sends one MULTI/XADD.../EXEC round trip per batch, on one connection)."""
        cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(self.port), "-n", str(self.a.events), "-c", "1",
               "-P", str(self.a.batch_size), "-r", "10000", "--csv",
               "XADD", f"bench.{tag}", "*", "id", "__rand_int__", "topic", "order.paid", "key", "order-__rand_int__",
               "payload", payloads["one_text"], "headers", "{}", "created_at", "2026-12-05 00:00:00.000000+00"]
        out = run_out(cmd)
        rows = [l for l in out.splitlines() if l.startswith('"XADD')]
        rate = float(rows[-1].split('","')[1].strip('"')) if rows else None
        n = self.count(tag)
        self.drop(tag)
        cmd_text = " ".join(shlex.quote(x) for x in cmd)
        return {"rate": rate, "summary": rows[-1][:200] if rows else out[-300:], "in_broker": n,
                "valid": rate is not None and n == self.a.events, "command": cmd_text}

    def consume(self, tag):
        import redis
        c = Consumer()
        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60)

        def loop():
            last = "0-0"
            while not c.stop_event.is_set():
                for _stream, entries in r.xread({f"bench.{tag}": last}, count=1000, block=100) or []:
                    now = time.time()
                    for entry_id, fields in entries:
                        c.arrivals[int(fields[b"id"])] = now
                        last = entry_id
        c.start(loop)
        return c


class Webhook:
    name = "webhook"

    def __init__(self, a, work):
        self.a, self.work = a, work

    def start(self):
        self.proc = subprocess.Popen([self.a.receiver_bin], stdout=subprocess.PIPE, text=True)
        hooks, control = self.proc.stdout.readline().split()
        self.url, self.control_base = f"http://{hooks}/hooks", f"http://{control}"
        self.pid = self.proc.pid
        self.version = "bench/webhook/receiver (Go net/http)"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def control(self, path, method="GET"):
        req = urllib.request.Request(self.control_base + path, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else {}

    def sink(self, tag, steady=False):
        self.control("/reset", "POST")
        # No signing secret: the tool cannot sign, and a signature is not a delivery guarantee.
        sink = {"name": "hooks", "type": "webhook", "url": self.url, "max_in_flight": self.a.webhook_in_flight,
                "timeout": "10s"}
        if self.a.webhook_events_per_request > 1:  # an older relay (--relay-bin-old) knows no such key
            sink["events_per_request"] = self.a.webhook_events_per_request
        return sink

    def count(self, tag):
        return self.control("/stats")["events"]

    def drop(self, tag):
        self.control("/reset", "POST")

    def tool(self, tag, payloads, extra_props=""):
        """hey: POSTs of one seeded payload (application/json, with the sink's webhook-id and
        webhook-timestamp headers) to the same receiver, the sink's max_in_flight workers on
        kept-alive connections; each request answered 204. With --webhook-events-per-request N > 1,
        each body is the JSON array the sink sends: N records of that payload (the file sink's
        record, as `format: json` sends them), and the rate counts N events a request.
        (hey gives each worker n / c requests: the requests rounded down to a multiple of c.)"""
        self.control("/reset", "POST")
        per_request = self.a.webhook_events_per_request
        n_sent = self.a.events // per_request // self.a.webhook_in_flight * self.a.webhook_in_flight
        body = payloads["one"]
        if per_request > 1:
            env = payloads["envelope"]
            record = (f'{{"id":{env["id"]},"topic":{json.dumps(env["topic"])},"key":{json.dumps(env["key"])},'
                      f'"payload":{payloads["one_text"]},"headers":{{}},"created_at":"{env["created_at"]}"}}\n')
            body = self.work / f"payload-batch-{per_request}.json"
            body.write_text("[" + ",".join([record] * per_request) + "]")
        cmd = [self.a.hey, "-n", str(n_sent), "-c", str(self.a.webhook_in_flight), "-m", "POST",
               "-T", "application/json", "-D", str(body),
               "-H", f"webhook-id: {payloads['envelope']['id']}", "-H", f"webhook-timestamp: {int(time.time())}",
               self.url]
        out = run_out(cmd)
        m = re.search(r"Requests/sec:\s+([\d.]+)", out)
        codes = re.search(r"Status code distribution:\s*\n\s*\[(\d+)\]\s+(\d+) responses", out)
        n = self.count(tag)
        self.drop(tag)
        return {"rate": float(m.group(1)) * per_request if m else None, "summary": m.group(0) if m else out[-300:],
                "status": codes.groups() if codes else None, "requests": n_sent, "in_broker": n,
                "valid": bool(m) and n == n_sent * per_request, "command": " ".join(cmd)}

    def consume(self, tag):
        c = Consumer()
        self.control("/reset", "POST")
        self.control("/record", "POST")

        def loop():
            c.stop_event.wait()
        c.start(loop)
        c.collect = lambda: c.arrivals.update(
            {int(k): v / 1e9 for k, v in self.control("/arrivals").items() if k.isdigit()})
        return c


BROKERS = {"kafka": Kafka, "nats": Nats, "rabbitmq": Rabbitmq, "redis": Redis, "webhook": Webhook}


# -- the run ----------------------------------------------------------------------------------

class Bench:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.postmaster = int((Path(a.pg_dir) / "data" / "postmaster.pid").read_text().split()[0])
        self.compare = set(a.compare_sinks.split(",")) if a.relay_bin_old else set()
        self.seq = 0
        # --kafka-variants: more kafka drains per round, each with its own sink properties or
        # batch_size, beside the sink's own (system "v:<label>").
        self.variants = {f"v:{v['label']}": v for v in json.loads(a.kafka_variants or "[]")}

    def tag(self, what):
        self.seq += 1
        return f"{what}{self.seq}"

    def payloads(self):
        """The seeded payloads: all of them one per line (ProducerPerformance), one of median
        length (the single-body tools), and their mean size."""
        seed(self.a.url, self.a.events)
        rows = [r[0] for r in sql(self.a.url, "SELECT payload::text FROM outbox_events ORDER BY id")]
        # A median row's envelope as the sinks send it (outbox-created-at in the relay's format).
        mid = sql(self.a.url, "SELECT id, topic, aggregate_id, to_char(created_at AT TIME ZONE 'UTC', "
                              "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM outbox_events "
                              f"ORDER BY id OFFSET {len(rows) // 2} LIMIT 1")[0]
        envelope = dict(zip(("id", "topic", "key", "created_at"), (str(x) for x in mid)))
        lines = self.work / "payloads.txt"
        lines.write_text("\n".join(rows) + "\n")
        one_text = sorted(rows, key=len)[len(rows) // 2]
        one = self.work / "payload-one.json"
        one.write_text(one_text)
        sizes = [len(r.encode()) for r in rows]
        return {"lines": lines, "one": one, "one_text": one_text, "mean_size": round(statistics.mean(sizes)),
                "envelope": envelope,
                "sizes": {"mean": round(statistics.mean(sizes), 1), "min": min(sizes), "max": max(sizes)}}

    def measure(self, broker, system, rnd, payloads):
        with CpuWindow(self.postmaster, broker.pid) as cpu:
            if system == "tool" or "tool" in self.variants.get(system, {}):
                # a "tool" variant: ProducerPerformance with more producer properties (k=v ...)
                r = broker.tool(self.tag("tool"), payloads, self.variants.get(system, {}).get("tool", ""))
            else:
                relay_bin = self.a.relay_bin_old if system in ("old", "old_file") else self.a.relay_bin
                log_path = self.logs / f"relay-{broker.name}-{system}-{rnd}.log"
                seed(self.a.url, self.a.events)
                cpu.a = cpu.snapshot()  # the seed is not the drain's
                if system in ("file", "old_file") or self.variants.get(system, {}).get("file"):
                    r = file_drain(self.a.url, relay_bin, self.work, self.a.events,
                                   self.variants.get(system, {}).get("batch_size", self.a.batch_size), log_path)
                else:
                    tag = self.tag("drain")
                    sink = broker.sink(tag)
                    variant = self.variants.get(system, {})
                    if "properties" in variant:
                        sink["properties"] = {**sink.get("properties", {}), **variant["properties"]}
                    if hasattr(broker, "jfr_start"):
                        broker.jfr_start(tag)
                    try:
                        r = timed_drain(self.a.url, relay_bin, self.work, broker.name, sink, self.a.events,
                                        variant.get("batch_size", self.a.batch_size), log_path, timeout=900)
                    finally:
                        if hasattr(broker, "jfr_stop"):
                            broker.jfr_stop(tag)
                    if variant:
                        r["variant"] = variant
                    r["in_broker"] = broker.count(tag)
                    r["valid"] = r["valid"] and r["in_broker"] == self.a.events
                    r["_tag"] = tag
        r["cpu"] = cpu.result
        # Outside the CPU window: counting the record batches runs a JVM (DumpLogSegments).
        if "_tag" in r:
            tag = r.pop("_tag")
            if getattr(self.a, "kafka_batches", False) and hasattr(broker, "batches"):
                r["batches"] = broker.batches(tag)
            broker.drop(tag)
        return r

    def drains(self, broker, payloads):
        systems = ["sink", "tool", "file"] + (["old", "old_file"] if broker.name in self.compare else [])
        if broker.name == "kafka":
            systems += list(self.variants)
        rounds = []
        for i in range(self.a.rounds):
            order = systems[i % len(systems):] + systems[:i % len(systems)]
            rnd = {"round": i + 1, "order": order}
            for system in order:
                log(f"{broker.name} round {i + 1}: {system}, {self.a.events} events")
                try:
                    rnd[system] = self.measure(broker, system, i + 1, payloads)
                except Exception as e:  # one failed figure is reported, the run goes on
                    rnd[system] = {"valid": False, "error": repr(e)[:2000]}
                x = rnd[system]
                error = f" {x['error']}" if "error" in x else ""
                where = f" {json.dumps(x['where'])}" if x.get("where") else ""
                if x.get("batches"):
                    where += f" batches {json.dumps(x['batches'])}"
                if x.get("cpu") and x.get("rate"):
                    c, n = x["cpu"], self.a.events
                    where += (f" us/event pg {c['postgres_cpu_seconds'] / n * 1e6:.1f} broker "
                              f"{c['broker_cpu_seconds'] / n * 1e6:.1f} measured {c['measured_cpu_seconds'] / n * 1e6:.1f}")
                    if c.get("broker_threads_cpu_seconds"):
                        where += " broker threads us/event " + ", ".join(
                            f"{k} {v / n * 1e6:.2f}" for k, v in list(c["broker_threads_cpu_seconds"].items())[:8])
                log(f"  {x.get('rate') or 0:,.0f}/s valid={x['valid']} "
                    f"foreign load {x.get('cpu', {}).get('foreign_cores')} cores{error}{where}")
            rounds.append(rnd)
        return rounds

    def steady(self, broker, relay_overrides):
        """A steady rate into an idle relay: commit-to-arrival at a consumer, broker CPU per event.
        relay_overrides: keys of the config's relay section for this run (e.g. light_poll_interval)."""
        seed(self.a.url, self.a.events)
        sql(self.a.url, "UPDATE outbox_events SET processed_at = created_at")
        sql(self.a.url, "VACUUM ANALYZE outbox_events")
        sql(self.a.url, "CHECKPOINT")
        history = sql(self.a.url, "SELECT max(id) FROM outbox_events")[0][0]
        tag = self.tag("steady")
        sink = broker.sink(tag, steady=True)
        cfg = {"database": {"url": self.a.url}, "relay": {"batch_size": self.a.batch_size, **relay_overrides},
               "http": {"enabled": False}, "log": {"level": "info"}, "sinks": [sink]}
        cfg_path = self.work / f"steady-{broker.name}.yaml"
        cfg_path.write_text(json.dumps(cfg, indent=2))
        consumer = broker.consume(tag)
        with open(self.logs / f"relay-steady-{broker.name}.log", "w") as log_file:
            relay = subprocess.Popen([self.a.relay_bin, "run", "--config", str(cfg_path)], stdout=subprocess.DEVNULL,
                                     stderr=log_file)
            try:
                time.sleep(2)  # the relay connects, takes its lanes and goes idle (not a correctness wait)
                # The broker's own idle CPU (a JVM's housekeeping, the consumer's empty fetches),
                # to tell apart from what the events cost it.
                idle0, t_idle = tree_cpu_seconds(broker.pid), time.monotonic()
                time.sleep(self.a.steady_idle_seconds)
                idle_cores = (tree_cpu_seconds(broker.pid) - idle0) / (time.monotonic() - t_idle)
                with CpuWindow(self.postmaster, broker.pid) as cpu:
                    broker_cpu0 = tree_cpu_seconds(broker.pid)
                    committed = steady_writers(self.a.url, self.a.steady_rate, self.a.steady_seconds)
                    deadline = time.monotonic() + 60
                    while sql(self.a.url, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")[0][0]:
                        if time.monotonic() > deadline:
                            raise RuntimeError("steady run: events left unprocessed")
                        time.sleep(0.1)
                    if hasattr(consumer, "collect"):
                        consumer.collect()
                    consumer.wait_for(set(committed))
                    broker_cpu = tree_cpu_seconds(broker.pid) - broker_cpu0
            finally:
                relay.terminate()
                relay.wait(timeout=30)
                consumer.close()
        rows = sql(self.a.url, "SELECT id, extract(epoch FROM processed_at) FROM outbox_events WHERE id > %s",
                   (history,))
        first = min(committed.values())
        measured = {oid for oid, t in committed.items() if t - first >= self.a.steady_warmup}
        arrival_ms = [(consumer.arrivals[oid] - committed[oid]) * 1000 for oid in measured if oid in consumer.arrivals]
        marked = {r[0]: float(r[1]) for r in rows}
        marked_ms = [(marked[oid] - committed[oid]) * 1000 for oid in measured if oid in marked]
        span = max(committed.values()) - first
        out = {"events": len(committed), "offered_rate": self.a.steady_rate,
               "achieved_rate": round(len(committed) / span, 1) if span > 0 else None,
               "arrived": len(set(committed) & consumer.arrivals.keys()), "consumer_errors": consumer.errors,
               "commit_to_arrival_ms": summary_ms(arrival_ms), "commit_to_marked_ms": summary_ms(marked_ms),
               "broker_cpu_seconds": round(broker_cpu, 3),
               "broker_cpu_us_per_event": round(broker_cpu / len(committed) * 1e6, 1) if committed else None,
               "broker_idle_cores": round(idle_cores, 3),
               "broker_cpu_us_per_event_above_idle": round(
                   (broker_cpu - idle_cores * cpu.result["wall_seconds"]) / len(committed) * 1e6, 1)
               if committed else None,
               "cpu": cpu.result}
        out["valid"] = out["arrived"] == len(committed) and not consumer.errors
        if "log_append_ms" in consumer.extra:
            ack = consumer.extra["log_append_ms"]
            out["commit_to_ack_ms"] = summary_ms([ack[oid] - committed[oid] * 1000 for oid in measured if oid in ack])
        try:
            broker.drop(tag)
        except Exception as e:  # the broker's leftovers do not change a figure already taken
            log(f"  dropping {tag}: {e!r}")
        return out

    def run(self):
        subprocess.run([self.a.relay_bin, "migrate"], env={**os.environ, "DATABASE_URL": self.a.url}, check=True,
                       capture_output=True, timeout=120)
        result = {"meta": self.meta(), "config": {k: v for k, v in vars(self.a).items() if k != "url"}, "sinks": {}}
        payloads = self.payloads()
        result["meta"]["payload_bytes"] = payloads["sizes"]
        if self.a.broker_own_core:
            # Postgres, this script and what it starts (the relay, the tools) on CPU 0; each
            # broker, once started, on CPU 1: the broker as it runs in production, on cores of
            # its own, instead of sharing the relay's and Postgres's.
            os.sched_setaffinity(0, {0})
            pin_tree(self.postmaster, {0})
        for name in self.a.sinks.split(","):
            broker = BROKERS[name](self.a, self.work)
            log(f"{name}: starting the broker")
            broker.start()
            if self.a.broker_own_core:
                pin_tree(broker.pid, {1})
            entry = {"broker_version": broker.version}
            try:
                if self.a.warmup:
                    # The JVM brokers (Kafka, RabbitMQ's Erlang VM too) serve their first requests
                    # slower: one unmeasured drain and tool run of a quarter of the events.
                    events, self.a.events = self.a.events, self.a.warmup_events or max(1000, self.a.events // 4)
                    try:
                        for w in range(self.a.warmup_rounds):
                            log(f"{name}: warm-up {w + 1}/{self.a.warmup_rounds} ({self.a.events} events, not measured)")
                            x = self.measure(broker, "sink", 0, payloads)
                            if x.get("cpu", {}).get("broker_threads_cpu_seconds"):
                                log(f"  broker threads (s): {json.dumps(x['cpu']['broker_threads_cpu_seconds'])}")
                            self.measure(broker, "tool", 0, payloads)
                    except Exception as e:  # the measured rounds report their own failures
                        log(f"  warm-up failed: {e!r}")
                    finally:
                        self.a.events = events
                if self.a.drains:
                    entry["drain_rounds"] = self.drains(broker, payloads)
                    entry["drain_summary"] = self.summarize(entry["drain_rounds"], self.a.events)
                for overrides in (json.loads(self.a.steady_relay) if self.a.steady else []):
                    log(f"{name}: steady {self.a.steady_rate}/s for {self.a.steady_seconds} s, relay {overrides}")
                    try:
                        st = self.steady(broker, overrides)
                    except Exception as e:  # reported; the other sinks still run
                        st = {"valid": False, "error": repr(e)[:2000]}
                    st["relay"] = overrides
                    entry.setdefault("steady_runs", []).append(st)
                    entry.setdefault("steady", st)
                    keys = ("commit_to_arrival_ms", "broker_cpu_us_per_event", "valid", "error")
                    log(f"  {json.dumps({k: st.get(k) for k in keys})}")
            finally:
                broker.stop()
            result["sinks"][name] = entry
            Path(self.a.out).write_text(json.dumps(result, indent=1, default=str))  # partial results survive
        result["meta"]["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return result

    @staticmethod
    def summarize(rounds, events):
        s = {}
        variants = sorted({k for r in rounds for k in r if k.startswith("v:")})
        for system in ("sink", "tool", "file", "old", "old_file", *variants):
            xs = [r[system] for r in rounds if system in r]
            if not xs:
                continue
            rates = [x["rate"] for x in xs if x.get("valid") and x.get("rate")]
            s[system] = {"median_rate": round(statistics.median(rates), 1) if rates else None, "rates": rates,
                         "valid_rounds": len(rates), "rounds": len(xs),
                         "foreign_cores": [x.get("cpu", {}).get("foreign_cores") for x in xs]}
        sink, tool, file = (s.get(k, {}).get("median_rate") for k in ("sink", "tool", "file"))
        s["sink_over_min_tool_file"] = round(sink / min(tool, file), 3) if sink and tool and file else None
        s["sink_over_min_tool_file_per_round"] = [
            round(r["sink"]["rate"] / min(r["tool"]["rate"], r["file"]["rate"]), 3) for r in rounds
            if all(r[k].get("valid") and r[k].get("rate") for k in ("sink", "tool", "file"))]
        for v in variants:
            rate = s[v]["median_rate"]
            s[v]["over_min_tool_file"] = round(rate / min(tool, file), 3) if rate and tool and file else None
            s[v]["over_min_tool_file_per_round"] = [
                round(r[v]["rate"] / min(r["tool"]["rate"], r["file"]["rate"]), 3) for r in rounds
                if all(r.get(k, {}).get("valid") and r.get(k, {}).get("rate") for k in (v, "tool", "file"))]
            s[v]["over_sink_per_round"] = [round(r[v]["rate"] / r["sink"]["rate"], 3) for r in rounds
                                           if r.get(v, {}).get("valid") and r["sink"].get("valid")]
            s[v]["cpu_us_per_event"] = [  # Postgres / broker / relay
                " / ".join(f"{r[v]['cpu'][k] / events * 1e6:.1f}" for k in
                           ("postgres_cpu_seconds", "broker_cpu_seconds", "measured_cpu_seconds"))
                for r in rounds if r.get(v, {}).get("valid") and r[v].get("cpu")]
        if "old" in s:
            old = s["old"]["median_rate"]
            s["new_over_old"] = round(sink / old, 3) if sink and old else None
            s["new_over_old_per_round"] = [round(r["sink"]["rate"] / r["old"]["rate"], 3) for r in rounds
                                           if r["sink"].get("valid") and r["old"].get("valid")]
        if "old_file" in s:
            old, new = s["old_file"]["median_rate"], s.get("file", {}).get("median_rate")
            s["file_new_over_old"] = round(new / old, 3) if new and old else None
            s["file_new_over_old_per_round"] = [round(r["file"]["rate"] / r["old_file"]["rate"], 3) for r in rounds
                                                if r["file"].get("valid") and r["old_file"].get("valid")]
        return s

    def meta(self):
        def out(cmd):
            try:
                return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                return None
        return {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "git": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
                "nproc": os.cpu_count(),
                "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                            None),
                "postgres": sql(self.a.url, "SHOW server_version")[0][0],
                "postgres_fsync": sql(self.a.url, "SHOW fsync")[0][0],
                "relay": out([self.a.relay_bin, "--version"]),
                "relay_old": out([self.a.relay_bin_old, "--version"]) if self.a.relay_bin_old else None,
                "tools": {"kafka": "org.apache.kafka.tools.ProducerPerformance (kafka-tools, tests/kafka/pom.xml)",
                          "nats": out([self.a.nats_cli, "--version"]),
                          "rabbitmq": f"PerfTest {Path(self.a.perf_test_lib).name}",
                          "redis": out(["redis-benchmark", "--version"]),
                          "webhook": f"hey {self.a.hey_version}"}}


def fmt(x):
    return f"{x:,.0f}" if x else "-"


def cpu_table(r):
    """Where each drain's CPU went, per event (median over rounds): Postgres, the broker and the
    relay (or the tool), and the machine's busy cores. The sink's drain pays Postgres and the broker
    on the same cores; the tool pays only the broker, the file sink only Postgres. The CPU ceiling
    is the rate at which the sink's drain would keep every core busy at its own CPU per event.
    "Bound by": the CPU when that ceiling is below 0.8 of min(tool, file); otherwise the longer of
    the drain's two overlapped stages, its claims or the sink's publish() (shares of its wall time,
    from the relay's /metrics)."""
    events, cores = r["config"]["events"], r["meta"]["nproc"]
    lines = ["", "CPU per event of each drain (median of the rounds, us): Postgres / broker / relay or tool; "
                 "busy cores; the sink's CPU ceiling = cores / its CPU per event; what bounds the sink's drain",
             "| sink | sink drain | busy cores | tool | busy cores | file drain | busy cores | sink's CPU ceiling "
             "| sink / ceiling | 0.8 x min(tool, file) | claims / publish() share of the sink's drain | bound by |",
             "| --- | --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for name, e in r["sinks"].items():
        if "drain_summary" not in e:
            continue  # --no-drains
        rounds = e.get("drain_rounds") or []
        summary = e["drain_summary"]
        rate = summary.get("sink", {}).get("median_rate")
        refs = [summary.get(k, {}).get("median_rate") for k in ("tool", "file")]
        target = 0.8 * min(refs) if all(refs) else None
        cells, ceiling = [], None
        for system in ("sink", "tool", "file"):
            cpus = [x[system]["cpu"] for x in rounds if x.get(system, {}).get("cpu")]
            if not cpus:
                cells += ["-", "-"]
                continue
            med = {k: statistics.median(c[k] for c in cpus) for k in
                   ("postgres_cpu_seconds", "broker_cpu_seconds", "measured_cpu_seconds", "wall_seconds")}
            us = [med[k] / events * 1e6 for k in ("postgres_cpu_seconds", "broker_cpu_seconds", "measured_cpu_seconds")]
            busy = sum(med[k] for k in ("postgres_cpu_seconds", "broker_cpu_seconds", "measured_cpu_seconds"))
            cells += [" / ".join(f"{u:.1f}" for u in us), f"{busy / med['wall_seconds']:.2f}"]
            if system == "sink" and sum(us) > 0:
                ceiling = cores / (sum(us) / 1e6)
                if r["config"].get("broker_own_core") and us[1] > 0:
                    # one core for Postgres and the relay, one for the broker
                    ceiling = min(1e6 / (us[0] + us[2]), 1e6 / us[1])
        wheres = [x["sink"]["where"] for x in rounds if x.get("sink", {}).get("where")]
        claims = statistics.median(w["claim_share"] for w in wheres) if wheres else None
        publish = statistics.median(w["publish_share"] for w in wheres) if wheres else None
        if ceiling and target and ceiling < target:
            bound = ("CPU: one core for Postgres and the relay cannot reach 0.8" if r["config"].get("broker_own_core")
                     else f"CPU: {cores} cores cannot reach 0.8")
        elif claims is not None and publish is not None:
            bound = "claims" if claims >= publish else "publish()"
        else:
            bound = "-"
        shares = f"{claims:.2f} / {publish:.2f}" if claims is not None and publish is not None else "-"
        lines.append(f"| {name} | {' | '.join(cells)} | {fmt(ceiling)} | "
                     f"{round(rate / ceiling, 3) if rate and ceiling else '-'} | {fmt(target)} | {shares} | {bound} |")
    return lines


def table(r):
    a = r["config"]
    lines = ["", f"drain of {a['events']:,} pending events, median of {a['rounds']} rounds (events/s); "
                 f"foreign load per round in cores; {r['meta']['nproc']} cores"]
    lines.append("| sink | sink | tool | file | sink / min(tool, file) | per round | foreign load (sink; tool; file) "
                 "| new/old |")
    lines.append("| --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for name, e in r["sinks"].items():
        if "drain_summary" not in e:
            continue  # --no-drains
        s = e.get("drain_summary", {})
        m = {k: s.get(k, {}).get("median_rate") for k in ("sink", "tool", "file", "old")}
        foreign = "; ".join(",".join(str(f) for f in s.get(k, {}).get("foreign_cores", [])) for k in
                            ("sink", "tool", "file"))
        old = (f"{s['new_over_old']} (old {fmt(m['old'])}/s; per round {s['new_over_old_per_round']})"
               if "old" in s else "-")
        if "old_file" in s:
            old += (f"; file {s['file_new_over_old']} (old {fmt(s['old_file']['median_rate'])}/s; per round "
                    f"{s['file_new_over_old_per_round']})")
        lines.append(f"| {name} | {fmt(m['sink'])} | {fmt(m['tool'])} | {fmt(m['file'])} | "
                     f"{s.get('sink_over_min_tool_file')} | {s.get('sink_over_min_tool_file_per_round')} | "
                     f"{foreign} | {old} |")
    for name, e in r["sinks"].items():
        s = e.get("drain_summary", {})
        variants = [k for k in s if k.startswith("v:")]
        if not variants:
            continue
        lines += ["", f"{name} variants (--kafka-variants): median events/s, / min(tool, file) per round, "
                      "/ the sink's drain per round, CPU us per event per round (Postgres / broker / relay)",
                  "| variant | events/s | / min(tool, file) | per round | / sink per round | CPU us/event |",
                  "| --- | ---: | ---: | --- | --- | --- |"]
        for v in variants:
            x = s[v]
            lines.append(f"| {v[2:]} | {fmt(x['median_rate'])} | {x.get('over_min_tool_file')} | "
                         f"{x.get('over_min_tool_file_per_round')} | {x.get('over_sink_per_round')} | "
                         f"{'; '.join(x.get('cpu_us_per_event', []))} |")
    if any("drain_summary" in e for e in r["sinks"].values()):
        lines += cpu_table(r)
    if any("steady" in e for e in r["sinks"].values()):
        lines.append("")
        lines.append(f"steady {a['steady_rate']}/s for {a['steady_seconds']} s "
                     f"(after a {a['steady_warmup']} s warm-up)")
        lines.append("| sink | commit-to-arrival p50 / p99 ms | commit-to-marked p50 / p99 ms | broker CPU us/event "
                     "| above its idle | broker idle (cores) | achieved/s | foreign load | valid |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for sink_name, e in r["sinks"].items():
            for st in e.get("steady_runs", []):
                name = sink_name + "".join(f" {k}={v}" for k, v in st.get("relay", {}).items())
                if "error" in st:
                    lines.append(f"| {name} | failed: {st['error'][:150]} | | | | | | | False |")
                    continue
                arr, mk = st["commit_to_arrival_ms"], st["commit_to_marked_ms"]
                extra = ""
                if "commit_to_ack_ms" in st:
                    extra = f" (ack {st['commit_to_ack_ms'].get('p50')} / {st['commit_to_ack_ms'].get('p99')})"
                lines.append(f"| {name} | {arr.get('p50')} / {arr.get('p99')}{extra} | "
                             f"{mk.get('p50')} / {mk.get('p99')} | "
                             f"{st['broker_cpu_us_per_event']} | {st['broker_cpu_us_per_event_above_idle']} | "
                             f"{st['broker_idle_cores']} | {st['achieved_rate']} | {st['cpu']['foreign_cores']} | "
                             f"{st['valid']} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--pg-dir", required=True, help="the cluster directory (for the postmaster's pid)")
    p.add_argument("--relay-bin", required=True)
    p.add_argument("--relay-bin-old", help="an older binary: the rabbitmq row (and --compare-sinks) also drain with it")
    p.add_argument("--compare-sinks", default="rabbitmq", help="sinks drained with --relay-bin-old too")
    p.add_argument("--out", required=True)
    p.add_argument("--sinks", default=",".join(SINKS))
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--warmup-rounds", type=int, default=1,
                   help="warm-up drains and tool runs before the rounds (a JVM broker's JIT keeps compiling)")
    p.add_argument("--warmup-events", type=int, default=0,
                   help="events of the unmeasured warm-up drain and tool run (default a quarter of --events)")
    p.add_argument("--steady", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--steady-rate", type=int, default=1000)
    p.add_argument("--steady-relay", default="[{}]",
                   help="a JSON list of relay-section overrides; the steady part runs once per entry, in order "
                        "(e.g. '[{\"light_poll_interval\": \"8ms\"}, {\"light_poll_interval\": \"16ms\"}]')")
    p.add_argument("--drains", action=argparse.BooleanOptionalAction, default=True,
                   help="--no-drains: only the steady part")
    p.add_argument("--steady-seconds", type=int, default=30)
    p.add_argument("--steady-warmup", type=float, default=3.0)
    p.add_argument("--steady-idle-seconds", type=float, default=5.0,
                   help="the broker's idle CPU is measured this long before the writers start")
    p.add_argument("--broker-own-core", action="store_true",
                   help="a diagnosis, not the benchmark: each broker (the webhook receiver too) pinned to CPU 1; "
                        "Postgres, the relay and the tools to CPU 0")
    p.add_argument("--kafka-partitions", type=int, default=3)
    p.add_argument("--kafka-properties", default="",
                   help="JSON object: the kafka sink's properties (librdkafka; override the sink's defaults)")
    p.add_argument("--kafka-tool-props", default="",
                   help="extra producer properties for ProducerPerformance, k=v separated by spaces (last wins)")
    p.add_argument("--kafka-variants", default="",
                   help='JSON list of more kafka drains per round: [{"label": "l5", "properties": {"linger.ms": '
                        '"5"}, "batch_size": 1000}, ...]; "file": true drains to the file sink instead; "tool": "k=v ..." runs '
                        'ProducerPerformance with those producer properties added')
    p.add_argument("--kafka-batches", action="store_true",
                   help="count the record batches (= librdkafka's produce requests) each kafka drain and tool "
                        "run left in the broker (DumpLogSegments)")
    p.add_argument("--kafka-jfr", default="",
                   help="a directory: a JFR recording of the broker per kafka drain and tool run")
    p.add_argument("--kafka-jfr-settings", default="profile",
                   help="the recordings' settings: a .jfc (e.g. profile.jfc with a 1 ms java sampling period)")
    p.add_argument("--nats-in-flight", type=int, default=1024, help="the nats sink's max_in_flight (its default)")
    p.add_argument("--rabbitmq-in-flight", type=int, default=1000, help="the rabbitmq sink's max_in_flight (default)")
    p.add_argument("--webhook-in-flight", type=int, default=16, help="the webhook sink's max_in_flight (default)")
    p.add_argument("--webhook-events-per-request", type=int, default=1,
                   help="the webhook sink's events_per_request (default 1); above 1, hey sends the same JSON "
                        "arrays and its rate counts their events")
    p.add_argument("--nats-cli", required=True)
    p.add_argument("--hey", required=True)
    p.add_argument("--hey-version", default="")
    p.add_argument("--perf-test-lib", required=True)
    p.add_argument("--receiver-bin", required=True)
    a = p.parse_args()
    unknown = set(a.sinks.split(",")) - set(SINKS)
    if unknown:
        p.error(f"unknown sink(s) {sorted(unknown)}; expected some of {list(SINKS)}")
    r = Bench(a).run()
    Path(a.out).write_text(json.dumps(r, indent=1, default=str))
    print(table(r))
    print(f"\nwritten: {a.out}")


if __name__ == "__main__":
    main()
