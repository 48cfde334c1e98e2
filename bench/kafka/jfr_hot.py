#!/usr/bin/env python3
"""Where a Kafka broker's Java CPU went in JFR recordings (bench/sinks.py --kafka-jfr): per
recording, the samples' threads, the hottest frames (self) and the broker's stages (inclusive:
a sample counts for every stage on its stack). Uses the JDK's `jfr print --json`.

    bench/kafka/jfr_hot.py [--top N] REC.jfr ...
"""
import argparse
import collections
import json
import subprocess

# (stage, a frame's "Class.method" contains one of these)
STAGES = [
    ("produce: validate records (LogValidator)", ("LogValidator.",)),
    ("produce: producer state (idempotence)", ("ProducerStateManager.", "ProducerAppendInfo.",
                                               "analyzeAndValidateProducerState")),
    ("produce: append to the segment", ("LogSegment.append", "FileRecords.append")),
    ("produce: UnifiedLog.append (all)", ("UnifiedLog.append",)),
    ("produce: handleProduceRequest (all)", ("KafkaApis.handleProduceRequest",)),
    ("produce: response and callbacks", ("sendResponseCallback", "ProduceResponse.")),
    ("request parsing (RequestChannel/RequestContext)", ("RequestContext.parseRequest", "AbstractRequest.parseRequest")),
    ("network threads (Processor)", ("network/Processor.", "SocketServer")),
    ("request metrics", ("updateRequestMetrics",)),
    ("delayed produce / purgatory", ("DelayedProduce", "DelayedOperation")),
    ("fetch (consumers)", ("handleFetchRequest",)),
    ("raft / controller", ("raft/", "controller/", "QuorumController")),
]


def samples(path):
    out = subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample", path], capture_output=True,
                         text=True, check=True).stdout
    for e in json.loads(out)["recording"]["events"]:
        st = e["values"].get("stackTrace") or {}
        frames = [f["method"]["type"]["name"] + "." + f["method"]["name"] for f in st.get("frames", [])]
        thread = (e["values"].get("sampledThread") or {}).get("javaName") or "?"
        yield thread.rstrip("0123456789-"), frames


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("recordings", nargs="+")
    a = p.parse_args()
    for path in a.recordings:
        threads, top, stages, n = collections.Counter(), collections.Counter(), collections.Counter(), 0
        for thread, frames in samples(path):
            n += 1
            threads[thread] += 1
            if frames:
                top[frames[0]] += 1
            for stage, needles in STAGES:
                if any(any(x in f for x in needles) for f in frames):
                    stages[stage] += 1
        print(f"== {path}: {n} samples")
        if not n:
            continue
        print("threads: " + ", ".join(f"{k} {v / n:.2f}" for k, v in threads.most_common(6)))
        print("stages (inclusive share of the samples):")
        for stage, _ in STAGES:
            print(f"  {stages[stage] / n:.3f}  {stage}")
        print("hottest frames (self):")
        for k, v in top.most_common(a.top):
            print(f"  {v / n:.3f}  {k}")


if __name__ == "__main__":
    main()
