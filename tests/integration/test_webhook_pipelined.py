"""Issue 45, part 1: the webhook sink pipelined (Sink::pipelined()) against a real HTTP receiver.

Batch k+1's requests start while batch k's answers are outstanding. One event of a key fails (a
500, or no answer before the sink's timeout) while later events of its key wait in the relay and
other keys' requests are in flight: the key's later events never reach the receiver before it,
other keys do not wait for it, and every event is delivered exactly once.
"""
from __future__ import annotations

import threading

import pytest

from conftest import base_config, pending, wait_until
from webhook_receiver import Reply, receivers, webhook_sink  # noqa: F401

BATCH = 40
EVENTS = 12 * BATCH
HOT = "hot"
# The failing event: in the third batch (a drain publishes its first batch alone, e.g. after a
# poll), with its key's later events after it in that batch and in every later one.
FAILING_AT = 3 * BATCH - 8
TIMEOUT = 1.0           # the sink's timeout (s)


def plan():
    """The key of each event, in id order: "hot" every 5th event from FAILING_AT on; the others
    12 keys a batch, of one set in even batches and of another in odd ones, so that only the hot
    key's events of a batch wait for the batch before (Sink::submit())."""
    keys = []
    for i in range(EVENTS):
        keys.append(HOT if i >= FAILING_AT and (i - FAILING_AT) % 5 == 0 else f"key-{(i // BATCH) % 2}-{i % 12}")
    return keys


@pytest.mark.parametrize("failure", ["500", "timeout"])
def test_a_failed_event_holds_only_its_key_while_the_next_batches_flow(db, relays, receivers, failure):
    keys = plan()
    ids = db.insert([("order.paid", key, {"i": i}) for i, key in enumerate(keys)])
    key_of = dict(zip(ids, keys))
    failing = ids[FAILING_AT]
    lock, failed = threading.Lock(), []

    def behaviour(req):
        with lock:
            first = req.event_id == failing and not failed
            if first:
                failed.append(req)
        if first and failure == "500":
            return Reply(500, b'{"error":"try later"}', delay=0.5)  # in flight beside the next batch
        if first:
            return Reply(stall=TIMEOUT + 0.5)  # no answer: the sink gives up after its timeout
        return Reply(200, delay=0.01)

    rx = receivers(behaviour)
    # Everything is pending before the relay starts: claims take batches of BATCH in id order. The
    # retry waits 2 s, long enough for every other key to drain while the hot key waits.
    relay = relays(base_config(db, [webhook_sink(rx.url, timeout=f"{int(TIMEOUT * 1000)}ms", max_in_flight=8)],
                               batch_size=BATCH, backoff={"initial": "2s", "max": "2s"}, sweep_interval="1s",
                               rebalance_interval="60s"))
    wait_until(lambda: pending(db) == 0, timeout=60, interval=0.1, message=f"all {EVENTS} events delivered")
    assert relay.alive()

    requests = rx.snapshot()
    by_id = {}
    for r in requests:
        by_id.setdefault(r.event_id, []).append(r)
    # Exactly once: one request per event, two for the failing one (its failure, its retry).
    assert sorted(by_id) == sorted(ids)
    twice = {i: [r.status for r in rs] for i, rs in by_id.items() if len(rs) != (2 if i == failing else 1)}
    assert not twice, f"requests per event: {twice}"
    first_try, retry = by_id[failing]
    assert first_try.status == (500 if failure == "500" else None) and retry.status == 200
    assert all(rs[-1].status == 200 for rs in by_id.values())
    done = {r[0] for r in db.query("SELECT id FROM outbox_events WHERE processed_at IS NOT NULL")}
    assert done == set(ids), "every event marked done, none dead-lettered"

    # The hot key: nothing after the failing event reaches the receiver before its retry's 2xx,
    # and its events arrive in id order.
    hot_ids = [i for i in ids if key_of[i] == HOT]
    later_hot = [i for i in hot_ids if i > failing]
    assert len(later_hot) >= 10
    early = [i for i in later_hot if by_id[i][0].arrived < retry.answered]
    assert not early, f"hot events sent before the failing event's retry was answered: {early}"
    hot_arrivals = [by_id[i][0].arrived for i in hot_ids]
    assert hot_arrivals == sorted(hot_arrivals), "the hot key's events arrived out of id order"
    # Per key, every other key's events too.
    for key in set(keys) - {HOT}:
        mine = [by_id[i][0].seq for i in ids if key_of[i] == key]
        assert mine == sorted(mine), f"{key}: events out of id order"

    # Other keys are not held: their later events arrive while the hot key waits for its retry.
    failed_at = first_try.answered if failure == "500" else first_try.arrived + TIMEOUT
    others_after = [i for i in ids if i > failing and key_of[i] != HOT]
    during = [i for i in others_after if failed_at <= by_id[i][0].arrived < retry.arrived]
    assert len(during) >= len(others_after) // 2, (len(during), len(others_after))

    # The failing request was in flight beside the next batch's requests.
    beside = [i for i in ids[3 * BATCH:] if first_try.arrived <= by_id[i][0].arrived < failed_at]
    assert beside, "no request of the next batch arrived while the failing one was in flight"
    print(f"\n{failure}: {len(requests)} requests, {len(beside)} of the next batches beside the failing request, "
          f"{len(during)} of {len(others_after)} later events of other keys during the hot key's wait")


def test_the_next_batch_starts_while_the_last_answers_are_outstanding(db, relays, receivers):
    """Every event its own key, so no event of a batch waits for the one before. The first event of
    each batch is answered after 0.3 s, the others at once: a batch's requests start while the
    previous batch's slow answer is outstanding, at every batch end (not pipelined: never)."""
    ids = db.insert([("order.paid", f"key-{i}", {"i": i}) for i in range(EVENTS)])
    slow = set(ids[::BATCH])
    rx = receivers(lambda req: Reply(200, delay=0.3 if req.event_id in slow else 0.005))
    relay = relays(base_config(db, [webhook_sink(rx.url, timeout="5s", max_in_flight=8)], batch_size=BATCH,
                               rebalance_interval="60s"))
    wait_until(lambda: pending(db) == 0, timeout=60, interval=0.1, message=f"all {EVENTS} events delivered")
    assert relay.alive()
    requests = rx.snapshot()
    assert sorted(r.event_id for r in requests) == sorted(ids), "each event sent exactly once"
    by_id = {r.event_id: r for r in requests}
    ends = EVENTS // BATCH - 1
    overlaps = 0
    for b in range(1, ends + 1):
        batch_ids, next_ids = ids[(b - 1) * BATCH:b * BATCH], ids[b * BATCH:(b + 1) * BATCH]
        overlaps += min(by_id[i].arrived for i in next_ids) < max(by_id[i].answered for i in batch_ids)
    print(f"\n{overlaps} of {ends} batch ends overlapped")
    assert overlaps >= ends * 2 // 3, f"only {overlaps} of {ends} batch ends overlapped"
