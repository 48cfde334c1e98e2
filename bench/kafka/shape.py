#!/usr/bin/env python3
"""The broker's CPU per message by message shape (issue 45): a throwaway broker
(tests/kafka/broker.sh), one librdkafka producer (confluent-kafka, acks=all, idempotent,
linger.ms 1) producing --events ~150-byte JSON messages in batches of --batch (flushed after each,
as the kafka sink's publish of one batch), per shape, alternating, --rounds rounds after one
unmeasured pass of each:
  sink      a key (10,000 keys, murmur2_random) and the sink's three outbox-* headers
  key       the key, no headers
  bare      neither (sticky partitioning, as ProducerPerformance)
Prints per shape the broker's CPU per message (its process tree, /proc), split by thread name
(request threads, JIT compiler threads), and the rate. Run under the bench lock:
    flock -x /tmp/outbox-bench.lock ~/.cache/outbox-relay/venv/bin/python bench/kafka/shape.py
"""
import argparse
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[2]
BROKER_SH = ROOT / "tests" / "kafka" / "broker.sh"
HZ = os.sysconf("SC_CLK_TCK")


def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = open(f"/proc/{pid}/task/{tid}/stat").read()
        except FileNotFoundError:
            continue
        name = re.sub(r"[0-9#-]+$", "", raw[raw.index("(") + 1:raw.rindex(")")]).strip()
        g = raw[raw.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(g[11]) + int(g[12])) / HZ
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--shapes", default="sink,key,bare")
    a = p.parse_args()
    rnd = random.Random(1)
    payloads = [('{"order_id": %d, "customer": "c-%05d", "amount": %d.%02d, "items": [{"sku": "sku-%04d", '
                 '"qty": %d}], "note": "%s"}' % (i, rnd.randrange(99999), rnd.randrange(1000), rnd.randrange(100),
                                                 rnd.randrange(9999), rnd.randrange(1, 9), "x" * rnd.randrange(10, 40))
                 ).encode() for i in range(a.events)]
    keys = [f"agg-{rnd.randrange(10_000)}".encode() for _ in range(a.events)]
    work = Path(tempfile.mkdtemp(prefix="outbox-kafka-shape."))
    brokers = subprocess.run([str(BROKER_SH), "start", str(work / "kafka")], capture_output=True, text=True,
                             check=True).stdout.strip()
    pid = int((work / "kafka" / "pid").read_text())
    results = {s: [] for s in a.shapes.split(",")}
    try:
        admin = AdminClient({"bootstrap.servers": brokers})
        seq = 0

        def run(shape):
            nonlocal seq
            seq += 1
            topic = f"shape.{shape}.{seq}"
            admin.create_topics([NewTopic(topic, num_partitions=a.partitions, replication_factor=1)])[topic].result()
            time.sleep(1)
            prod = Producer({"bootstrap.servers": brokers, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 1, "partitioner": "murmur2_random"})
            prod.produce(topic, b"x")  # connect and fetch metadata outside the window
            prod.flush()
            t0, c0 = time.monotonic(), threads(pid)
            for start in range(0, a.events, a.batch):
                for i in range(start, min(a.events, start + a.batch)):
                    if shape == "sink":
                        prod.produce(topic, payloads[i], keys[i], headers=[
                            ("outbox-id", str(1_000_000 + i).encode()), ("outbox-topic", b"orders"),
                            ("outbox-created-at", b"2026-12-07T01:36:38.123456Z")])
                    elif shape == "key":
                        prod.produce(topic, payloads[i], keys[i])
                    else:
                        prod.produce(topic, payloads[i])
                prod.flush()
            t1, c1 = time.monotonic(), threads(pid)
            d = {k: v - c0.get(k, 0.0) for k, v in c1.items()}
            admin.delete_topics([topic])[topic].result()
            per = lambda s: s / a.events * 1e6
            req = sum(v for k, v in d.items() if k.startswith("data-plane"))
            jit = sum(v for k, v in d.items() if "Compiler" in k)
            return {"rate": a.events / (t1 - t0), "broker": per(sum(d.values())), "requests": per(req), "jit": per(jit)}

        for shape in results:  # warm-up
            run(shape)
        shapes = list(results)
        for r in range(a.rounds):
            for shape in shapes[r % len(shapes):] + shapes[:r % len(shapes)]:
                x = run(shape)
                results[shape].append(x)
                print(f"round {r + 1} {shape}: {x['rate']:,.0f}/s broker {x['broker']:.2f} us/msg "
                      f"(request threads {x['requests']:.2f}, JIT {x['jit']:.2f})", flush=True)
    finally:
        subprocess.run([str(BROKER_SH), "stop", str(work / "kafka")], timeout=60)
    print("| shape | msgs/s (median) | broker us/msg | request threads | JIT |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for shape, xs in results.items():
        m = {k: statistics.median(x[k] for x in xs) for k in ("rate", "broker", "requests", "jit")}
        print(f"| {shape} | {m['rate']:,.0f} | {m['broker']:.2f} | {m['requests']:.2f} | {m['jit']:.2f} |")


if __name__ == "__main__":
    main()
