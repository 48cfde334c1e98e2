"""Issue 12, part 2: the writer examples in examples/ (Python, Go, Node.js, Java, Rust), each run as
a real program against the test Postgres with the real relay draining into a file sink.

Each example commits an order and `order.placed` (plain INSERT), then `order.paid`
(outbox_publish), then rolls back a cancellation, and prints one line per event:
`committed|rolled back TOPIC id=N ...`. The test asserts that exactly the committed events
arrived, once each, with their keys, payloads and the caller's trace context, and none of the
rolled-back ones; and that the business rows match."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import base_config, read_jsonl, wait_until

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "examples" / "install.sh"
LANGUAGES = ["python", "go", "node", "java", "rust"]

# The W3C Trace Context spec's own examples.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
W3C_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-01$")
LINE = re.compile(r"^(committed|rolled back) (order\.\w+) id=(\d+)\b")


@pytest.fixture(scope="module")
def example_commands():
    """Builds the examples (a no-op when install-deps.sh already did and nothing changed), then
    returns language -> argv prefix."""
    proc = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"examples/install.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = subprocess.check_output([str(INSTALL), "--print"], text=True)
    commands = dict(line.split("\t", 1) for line in out.splitlines())
    assert sorted(commands) == sorted(LANGUAGES)
    return {lang: shlex.split(cmd) for lang, cmd in commands.items()}


def run_example(argv, db, order_id, trace_env):
    env = {k: v for k, v in os.environ.items() if k not in ("TRACEPARENT", "TRACESTATE", "DATABASE_URL")}
    env.update(trace_env, DATABASE_URL=db.url)
    proc = subprocess.run([*argv, order_id], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    lines = [LINE.match(line) for line in proc.stdout.splitlines()]
    assert all(lines), f"unexpected output:\n{proc.stdout}"
    outcome = [(m.group(1), m.group(2)) for m in lines]
    assert outcome == [("committed", "order.placed"), ("committed", "order.paid"),
                       ("rolled back", "order.cancelled")], proc.stdout
    return {m.group(2): int(m.group(3)) for m in lines}


@pytest.mark.parametrize("lang", LANGUAGES)
def test_example_delivers_exactly_its_committed_events_with_the_trace_context(lang, db, relays, workdir,
                                                                             example_commands):
    sink_path = workdir / "events.jsonl"
    relay = relays(base_config(db, [{"name": "audit", "type": "file", "path": str(sink_path)}]))
    relay.wait_log("ordering lanes rebalanced")

    traced_order, new_trace_order = f"{lang}-order-1", f"{lang}-order-2"
    traced = run_example(example_commands[lang], db, traced_order,
                         {"TRACEPARENT": TRACEPARENT, "TRACESTATE": TRACESTATE})
    untraced = run_example(example_commands[lang], db, new_trace_order, {})
    # Written after both runs: once it arrived, every lower id (the rolled-back ones included) is
    # resolved by the relay, so nothing of the examples can still come.
    sentinel = db.insert([("sentinel", "sentinel", {"after": lang})])[0]
    wait_until(lambda: any(e["id"] == sentinel for e in read_jsonl(sink_path)), timeout=30,
               message="the sentinel event in the file sink")

    events = read_jsonl(sink_path)
    by_id = {e["id"]: e for e in events}
    assert len(by_id) == len(events), "each event once"
    expected_ids = {traced["order.placed"], traced["order.paid"], untraced["order.placed"], untraced["order.paid"],
                    sentinel}
    assert set(by_id) == expected_ids
    assert traced["order.cancelled"] not in by_id and untraced["order.cancelled"] not in by_id

    def arrived(event_id):
        e = by_id[event_id]
        return e["topic"], e["key"], e["payload"]

    for order, ids in ((traced_order, traced), (new_trace_order, untraced)):
        assert arrived(ids["order.placed"]) == ("order.placed", order, {"order_id": order, "amount_cents": 1999})
        assert arrived(ids["order.paid"]) == ("order.paid", order, {"order_id": order})

    # The caller's trace context, unchanged; without one, both events of a run share a new trace.
    for topic in ("order.placed", "order.paid"):
        assert by_id[traced[topic]]["headers"] == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    new_headers = [by_id[untraced[t]]["headers"] for t in ("order.placed", "order.paid")]
    assert new_headers[0] == new_headers[1]
    assert list(new_headers[0]) == ["traceparent"]
    assert W3C_TRACEPARENT.match(new_headers[0]["traceparent"]), new_headers[0]
    assert new_headers[0]["traceparent"] != TRACEPARENT

    # The business rows: the rollback undid the cancellation together with its event.
    assert db.query("SELECT id, status, amount_cents FROM orders ORDER BY id") == [
        (traced_order, "paid", 1999), (new_trace_order, "paid", 1999)]
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE topic = 'order.cancelled'") == 0
    # Marks follow the sink by up to 50 ms (a steady stream's outcomes are written together).
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0,
               timeout=10, message="every event marked")
    assert relay.alive()
