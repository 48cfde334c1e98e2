"""The sweep (docs/design.md "How wakeups work"): every sweep_interval it looks, in short steps,
for an event below what polls look at, and drains only when it finds one, so that a steady stream
does not wait behind a claim that walks the pending index from its start."""
from __future__ import annotations

import time

from conftest import free_port, read_jsonl, wait_until
from test_ops import file_sink, ops_config, scrape


def test_the_sweep_claims_an_event_only_polls_would_miss_and_nothing_else(db, relays, workdir):
    out = workdir / "events.jsonl"
    port = free_port()
    relay = relays(ops_config(db, file_sink(out), port, sweep_interval="1s"))
    relay.wait_log("listening")
    ids = db.insert([("order.paid", f"k{i % 4}", {"i": i}) for i in range(20)])
    wait_until(lambda: sorted(line["id"] for line in read_jsonl(out)) == ids, timeout=10, message="the 20 events")

    # Three sweeps or more with nothing to find: none of them drains.
    m0 = scrape(port)
    time.sleep(3.5)
    m1 = scrape(port)
    assert m1.value("outbox_relay_wakeups_total", source="sweep") == m0.value("outbox_relay_wakeups_total", source="sweep")

    # Delivered once, made pending again behind the relay's back (no NOTIFY, as an operator's own
    # UPDATE would): its id is below everything polls look at, so only the sweep finds it.
    db.query("UPDATE outbox_events SET processed_at = NULL WHERE id = %s RETURNING id", (ids[5],))
    wait_until(lambda: [line["id"] for line in read_jsonl(out)].count(ids[5]) == 2, timeout=5,
               message="the event made pending again, delivered by the sweep")
    lines = read_jsonl(out)
    assert len(lines) == 21 and sorted(line["id"] for line in lines[:20]) == ids and lines[20]["id"] == ids[5]
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0
    m2 = scrape(port)
    assert m2.value("outbox_relay_wakeups_total", source="sweep") == m1.value("outbox_relay_wakeups_total", source="sweep") + 1
    assert relay.stop() == 0
