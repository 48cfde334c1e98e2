"""Kafka for the integration tests: a real single-node Apache Kafka broker (KRaft) started by the
test run through tests/kafka/broker.sh (jars from Maven Central on first use), and a consumer
that reads a topic back completely. Import the fixtures into a test module:

    from kafka_fixtures import kafka_broker, own_kafka_broker, read_topic  # noqa: F401
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "kafka"))
from broker_process import BrokerProcess  # noqa: E402


class Broker(BrokerProcess):
    """One broker process in its own directory, with the tests' topic helper."""

    def create_topic(self, name: str, partitions: int = 3, config: dict | None = None):
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                config=config or {})])
        futures[name].result(timeout=30)
        # Wait until the topic's leaders are known, so a producer does not race the creation.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(name, timeout=10).topics.get(name)
            if md and md.error is None and len(md.partitions) == partitions and all(
                    p.leader >= 0 for p in md.partitions.values()):
                return
            time.sleep(0.1)
        raise AssertionError(f"topic {name} did not become ready")


@dataclass
class Message:
    partition: int
    offset: int
    key: str
    value: bytes
    headers: list = field(default_factory=list)  # [(name, value-bytes)] in message order
    timestamp_ms: int = 0

    def header(self, name: str) -> str | None:
        for n, v in self.headers:
            if n == name:
                return v.decode()
        return None

    @property
    def outbox_id(self) -> int:
        return int(self.header("outbox-id"))


def read_topic(bootstrap: str, topic: str, timeout: float = 120.0) -> list[Message]:
    """Every message of every partition of topic, from the beginning to the high watermark as it
    is when called, in (partition, offset) order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "outbox-test-" + uuid.uuid4().hex[:8],
                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        md = consumer.list_topics(topic, timeout=30).topics[topic]
        assert md.error is None, md.error
        partitions = sorted(md.partitions)
        high = {}
        for p in partitions:
            _, high[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        nxt = {p: 0 for p in partitions}
        out = []
        deadline = time.monotonic() + timeout
        while any(nxt[p] < high[p] for p in partitions):
            assert time.monotonic() < deadline, f"reading {topic} timed out at {nxt} of {high}"
            for m in consumer.consume(num_messages=10000, timeout=0.5):
                if m.error():
                    continue
                if m.offset() >= high[m.partition()]:
                    continue
                out.append(Message(m.partition(), m.offset(), m.key().decode() if m.key() is not None else None,
                                   m.value(), list(m.headers() or []), m.timestamp()[1]))
                nxt[m.partition()] = m.offset() + 1
        out.sort(key=lambda m: (m.partition, m.offset))
        return out
    finally:
        consumer.close()


def check_order(messages: list[Message]) -> dict:
    """Per key, the first occurrence of each outbox-id must come in increasing id order (a key
    lives on one partition, so (partition, offset) order is the order consumers see). Returns
    {"duplicates": n, "ids": set(...)}."""
    seen = set()
    last = {}
    duplicates = 0
    for m in messages:
        oid = m.outbox_id
        if oid in seen:
            duplicates += 1
            continue
        seen.add(oid)
        assert oid > last.get(m.key, 0), f"key {m.key}: id {oid} arrived after {last[m.key]}"
        last[m.key] = oid
    return {"duplicates": duplicates, "ids": seen}


def _new_broker(extra=()) -> Broker:
    base = Path(tempfile.mkdtemp(prefix="outbox-kafka-"))
    return Broker(base / "broker", extra).start()


@pytest.fixture(scope="session")
def kafka_broker():
    """One broker for the whole session. Tests use topics of their own."""
    broker = _new_broker()
    yield broker
    broker.stop()
    subprocess.call(["rm", "-rf", str(broker.dir.parent)])


@pytest.fixture
def own_kafka_broker():
    """A broker for one test, which may kill and restart it."""
    broker = _new_broker()
    yield broker
    broker.stop()
    subprocess.call(["rm", "-rf", str(broker.dir.parent)])


@pytest.fixture
def strict_kafka_broker():
    """A broker for one test that creates no topic on its own (auto.create.topics.enable=false): a
    message to a missing topic fails with UNKNOWN_TOPIC_OR_PART until the test creates it."""
    broker = _new_broker(["auto.create.topics.enable=false"])
    yield broker
    broker.stop()
    subprocess.call(["rm", "-rf", str(broker.dir.parent)])
