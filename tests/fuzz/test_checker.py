"""The checker on hand-made histories (no database, no relay):
    ~/.cache/outbox-relay/venv/bin/python -m pytest -q tests/fuzz/test_checker.py"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checker import READING_CAP, check  # noqa: E402
from harness import Reading, SinkLine, kafka_interval  # noqa: E402
from ledger import POISON_PREFIX, Ledger, Truncate  # noqa: E402


def txn(L, behaviour, start, end, outcome="committed", db="main", epoch=0):
    t = L.begin(behaviour, 0, db=db, epoch=epoch)
    t.start = start
    L.end(t, outcome, when=end)
    return t


def row(L, t, uid, key, event_id):
    r = L.row(t, uid, key, "topic", {})
    r.id = event_id
    return r


def line(r, file, index, lo, hi, event_id=None):
    rec = {"id": r.id if event_id is None else event_id, "topic": r.topic, "key": r.key,
           "payload": {"uid": r.uid}, "headers": {}}
    return SinkLine(rec, file, index, lo, hi)


def poison_pair(L, suffix, b_commit=(1.1, 1.2)):
    """Two rows of one poison key: a committed at 1.0, then b."""
    key = POISON_PREFIX + suffix
    return row(L, txn(L, "x", 0.0, 1.0), "a", key, 1), row(L, txn(L, "x", *b_commit), "b", key, 2)


def kinds(res):
    return sorted(v.kind for v in res.violations)


def test_in_order_on_time_passes():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.1, 1.2), "b", "K", 2)
    res = check(L, [line(a, "f0", 0, 1.0, 1.01), line(b, "f0", 1, 1.2, 1.21)], now=10.0)
    assert kinds(res) == []
    assert res.stats["events_delivered"] == 2


def test_same_file_out_of_order_is_a_violation():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 0.5, 0.6), "b", "K", 2)
    # One read saw both: the file's order decides.
    res = check(L, [line(b, "f0", 0, 1.0, 1.01), line(a, "f0", 1, 1.0, 1.01)], now=10.0)
    assert kinds(res) == ["order"]


def test_across_files_only_a_provable_order_counts():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.0, 1.1), "b", "K", 2)
    # Overlapping intervals in two files: not provably out of order.
    res = check(L, [line(b, "f1", 0, 1.10, 1.12), line(a, "f0", 0, 1.11, 1.13)], now=10.0)
    assert kinds(res) == []
    # b seen (hi 1.12) before a's file was read without it (lo 1.2): out of order.
    res = check(L, [line(b, "f1", 0, 1.10, 1.12), line(a, "f0", 0, 1.2, 1.21)], now=10.0)
    assert kinds(res) == ["order"]


def test_a_resend_after_a_later_event_is_fine():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.0, 1.1), "b", "K", 2)
    lines = [line(a, "f0", 0, 1.0, 1.01), line(b, "f1", 0, 1.2, 1.21), line(a, "f1", 1, 1.2, 1.21)]
    assert kinds(check(L, lines, now=10.0)) == []


def test_an_undelivered_lower_id_makes_a_delivered_higher_one_out_of_order():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.0, 1.1), "b", "K", 2)
    res = check(L, [line(b, "f0", 0, 1.1, 1.15)], now=1.5)   # a not due yet: only the order
    assert kinds(res) == ["order"]


def test_late_missing_and_the_holder_rule():
    L = Ledger()
    hold = txn(L, "tx_hold", 0.5, 5.0)                     # open at a's commit: a may wait for it
    a = row(L, txn(L, "x", 0.9, 1.0), "a", "K", 2)
    row(L, hold, "h", "H", 1)
    c = row(L, txn(L, "x", 5.5, 5.6), "c", "C", 3)
    lines = [line(a, "f0", 0, 6.5, 6.51), line(L.rows["h"], "f0", 1, 5.0, 5.01)]
    res = check(L, lines, now=20.0)
    assert kinds(res) == ["missing"]                       # a: due 7.0, in time; c: never
    assert res.violations[0].uids == [c.uid]
    res = check(L, [line(a, "f0", 0, 7.2, 7.21), line(L.rows["h"], "f0", 1, 5.0, 5.01),
                    line(c, "f0", 2, 6.0, 6.01)], now=20.0)
    assert kinds(res) == ["late"]


def test_the_other_database_and_rolled_back_rows():
    L = Ledger()
    f = row(L, txn(L, "other_db", 0.0, 1.0, db="copy"), "f", "K", 1)
    r = row(L, txn(L, "tx_rollback", 0.0, 1.0, outcome="rolled_back"), "r", "K", 2)
    s_txn = txn(L, "tx_savepoint", 0.0, 1.0)
    s = row(L, s_txn, "s", "K", 3)
    s.intent = "rollback"
    res = check(L, [line(f, "f0", 0, 1.1, 1.2), line(r, "f0", 1, 1.1, 1.2), line(s, "f0", 2, 1.1, 1.2)], now=10.0)
    assert kinds(res) == ["foreign_delivered", "rolled_back_delivered", "rolled_back_delivered"]


def test_epochs_are_separate_and_truncated_rows_are_not_demanded():
    L = Ledger()
    old = row(L, txn(L, "x", 0.0, 1.0, epoch=0), "old", "K", 5)
    L.truncates.append(Truncate(1.5, 1.6, 0))
    L.epoch = 1
    new = row(L, txn(L, "x", 2.0, 2.1, epoch=1), "new", "K", 1)
    # The old epoch's id 5 was truncated before it was due and never delivered; the new id 1 goes.
    res = check(L, [line(new, "f0", 0, 2.1, 2.2)], now=10.0)
    assert kinds(res) == []


def test_a_failed_attempt_moves_its_deadline_and_its_keys_later_events():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.1, 1.2), "b", "K", 2)
    # a failed at 1.05 and again at 2.0: its retry may come 0.2 s after that; b waits for it.
    failures = {"a": [1.05, 2.0]}
    res = check(L, [line(a, "f0", 0, 4.1, 4.11), line(b, "f0", 1, 4.15, 4.16)], now=10.0, failures=failures)
    assert kinds(res) == []
    res = check(L, [line(a, "f0", 0, 4.3, 4.31), line(b, "f0", 1, 4.35, 4.36)], now=10.0, failures=failures)
    assert kinds(res) == ["late", "late"]


def test_a_poison_key_that_failed_may_be_dead_lettered_and_its_key_goes_on():
    L = Ledger()
    _, b = poison_pair(L, "1")
    res = check(L, [line(b, "f0", 0, 1.3, 1.31)], now=10.0, failures={"a": [1.05]},
                dead={"a": "its outcome (retry) could not be written: ... fuzz_no_retry_of_poison (SQLSTATE 23514)"})
    assert kinds(res) == []
    assert res.stats["dead_lettered_poison_key"] == 1


def test_a_dead_lettered_poison_row_is_attempted_by_its_deadline_and_its_key_waits_for_that_attempt():
    L = Ledger()
    _, b = poison_pair(L, "1")
    dead = {"a": "its outcome (retry) could not be written"}
    # a first attempted at 2.9 (its deadline 3.0): on time; b waits for a's attempt and then has
    # the retry's allowance and the budget (2.9 + 0.1 + 2.0).
    res = check(L, [line(b, "f0", 0, 4.9, 4.91)], now=10.0, failures={"a": [2.9]}, dead=dead)
    assert kinds(res) == []
    # a first attempted at 3.5, 0.5 s past its deadline: late, though it is not delivered.
    res = check(L, [line(b, "f0", 0, 3.6, 3.61)], now=10.0, failures={"a": [3.5]}, dead=dead)
    assert kinds(res) == ["late"] and "dead-lettered, first attempted 2.50 s after its commit" in res.violations[0].text


def test_a_dead_letter_without_a_failure_or_of_another_key_is_a_violation():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", POISON_PREFIX + "1", 1)
    b = row(L, txn(L, "x", 0.0, 1.0), "b", "K", 2)
    # A key too long for a B-tree entry is retried as any other since schema 13.
    c = row(L, txn(L, "x", 0.0, 1.0), "c", "L" * 3000, 3)
    res = check(L, [], now=1.5, failures={"b": [1.05], "c": [1.05]}, dead={"a": "why", "b": "why", "c": "why"})
    assert kinds(res) == ["dead_lettered", "dead_lettered", "dead_lettered"]


def test_a_row_the_receiver_refused_alone_may_be_dead_lettered_and_only_it():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.1, 1.2), "b", "K", 2)
    c = row(L, txn(L, "x", 0.0, 1.0), "c", "L", 3)
    dead = {"a": "permanent: HTTP 422: fuzz: this event is refused"}
    # a refused in a request with c (1.05), then alone (1.1): dead-lettered; its key goes on.
    res = check(L, [line(c, "f0", 0, 1.15, 1.16), line(b, "f0", 1, 1.3, 1.31)], now=10.0,
                failures={"a": [1.05, 1.1]}, dead=dead, refused={"a"})
    assert kinds(res) == []
    assert res.stats["dead_lettered_refused"] == 1 and res.stats["dead_lettered_poison_key"] == 0
    # c, refused only as a's co-passenger, dead-lettered too (a relay that did not split the
    # request): a violation, and c is missing.
    res = check(L, [line(b, "f0", 0, 1.3, 1.31)], now=10.0, final=True, failures={"a": [1.05, 1.1]},
                dead={**dead, "c": dead["a"]}, refused={"a"})
    assert kinds(res) == ["dead_lettered", "missing"]
    assert any(v.kind == "dead_lettered" and "uid c" in v.text for v in res.violations)


def test_a_refused_row_whose_dead_letter_a_truncate_removed_lets_its_key_go_on():
    # a refused alone at 1.1, its key's b delivered at 1.3, the table truncated at 1.35 before the
    # relay wrote a's dead letter: no dead letter is left to read, and b's order is fine.
    L = Ledger()
    row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 0.0, 1.0), "b", "K", 2)
    lines = [line(b, "f0", 0, 1.3, 1.31)]
    L.truncates.append(Truncate(1.35, 1.4, 0))
    assert kinds(check(L, lines, now=10.0, failures={"a": [1.05, 1.1]}, refused={"a"})) == []
    # Truncated before the refusal, or not refused alone: b went before a, which is not accounted for.
    L.truncates[0] = Truncate(1.08, 1.09, 0)
    assert kinds(check(L, lines, now=10.0, failures={"a": [1.05, 1.1]}, refused={"a"})) == ["order"]
    L.truncates[0] = Truncate(1.35, 1.4, 0)
    assert kinds(check(L, lines, now=10.0, failures={"a": [1.05, 1.1]}, refused=set())) == ["order"]


def test_a_writer_that_began_in_a_stop_window_after_the_commit_holds_it_whatever_else_did():
    L = Ledger()
    hold = txn(L, "tx_hold", 0.5, 3.0)              # open at a's commit, ends after the stop's release
    row(L, hold, "h", "H", 1)
    a = row(L, txn(L, "x", 1.0, 1.5), "a", "K", 2)
    later = txn(L, "prepared", 2.0, 6.0)            # began during the stop, after a's commit
    row(L, later, "p", "P", 3)
    w = L.window("relay_stop")
    w.start, w.end, w.release_at = 1.2, 2.8, 2.8
    lines = [line(L.rows["h"], "f0", 0, 3.0, 3.01), line(a, "f0", 1, 6.1, 6.11), line(L.rows["p"], "f0", 2, 6.1, 6.11)]
    assert kinds(check(L, lines, now=20.0)) == []   # no reading between a's commit and 2.8: p may hold a
    w.start, w.end, w.release_at = 0.2, 0.4, 0.4    # a stop over before a's commit: p cannot
    assert kinds(check(L, lines, now=20.0)) == ["late"]


def test_a_writer_that_began_before_the_relays_next_reading_holds_it_at_most_reading_cap():
    L = Ledger()
    hold = txn(L, "fastpath", 0.5, 3.0)             # open at a's commit: a waits for it
    row(L, hold, "h", "H", 1)
    a = row(L, txn(L, "x", 1.0, 1.5), "a", "K", 2)
    later = txn(L, "prepared", 1.8, 6.0)            # began 0.3 s after a's commit
    row(L, later, "p", "K", 3)
    lines = [line(L.rows["h"], "relay0", 0, 3.0, 3.01), line(a, "relay0", 1, 6.1, 6.11),
             line(L.rows["p"], "relay0", 2, 6.1, 6.11)]
    # Without the relays' readings, a later writer is told apart at once: a is late.
    assert kinds(check(L, lines, now=20.0)) == ["late"]
    # relay0 (which delivered a) read at 1.6 with a last id below a's, then not before 1.9: the
    # writer that began at 1.8 cannot be told from one open at a's commit.
    readings = [Reading(1.59, 1.6, 0, 1, 1, 1), Reading(1.88, 1.9, 0, 1, 3, 1)]
    assert kinds(check(L, lines, now=20.0, readings=readings)) == []
    # A reading at 1.7 reached a's id: the writer began after it, and a is late again.
    readings = [Reading(1.69, 1.7, 0, 1, 2, 1)] + readings[1:]
    assert kinds(check(L, lines, now=20.0, readings=readings)) == ["late"]
    # Another relay's reading does not count, nor one while ids were cached.
    readings = [Reading(1.69, 1.7, 1, 1, 2, 1), Reading(1.69, 1.7, 0, 1, 2, 8), Reading(1.88, 1.9, 0, 1, 3, 1)]
    assert kinds(check(L, lines, now=20.0, readings=readings)) == []
    # No reading at all: a writer that began within READING_CAP of the commit holds it, one that
    # began later does not (the relay should have read by then).
    later.start = 1.5 + READING_CAP - 0.1
    assert kinds(check(L, lines, now=20.0, readings=[])) == []
    later.start = 1.5 + READING_CAP + 0.1
    assert kinds(check(L, lines, now=20.0, readings=[])) == ["late"]


# --- --sinks kafka: records of several partitions, ordered by their LogAppendTime (ms)

def kafka_line(r, topic, partition, offset, ts_ms):
    lo, hi = kafka_interval(ts_ms, 0.0)
    return line(r, f"{topic}/{partition}", offset, lo, hi)


def test_kafka_a_later_event_appended_in_an_earlier_millisecond_of_another_topic_is_out_of_order():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 0.0, 1.0), "b", "K", 2)
    # One batch: id 1 to topic t1 (retried, appended at 1.250 s), id 2 to t2 appended at 1.100 s.
    res = check(L, [kafka_line(b, "t2", 0, 0, 1100), kafka_line(a, "t1", 1, 0, 1250)], now=10.0)
    assert kinds(res) == ["order"]
    # One millisecond apart is enough: the broker appended id 2 in an earlier millisecond.
    res = check(L, [kafka_line(b, "t2", 0, 0, 1100), kafka_line(a, "t1", 1, 0, 1101)], now=10.0)
    assert kinds(res) == ["order"]
    # In id order across topics: fine.
    res = check(L, [kafka_line(a, "t1", 1, 0, 1100), kafka_line(b, "t2", 0, 0, 1101)], now=10.0)
    assert kinds(res) == []


def test_kafka_the_same_millisecond_in_two_partitions_is_ambiguous_not_a_violation():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 0.0, 1.0), "b", "K", 2)
    res = check(L, [kafka_line(b, "t2", 0, 0, 1100), kafka_line(a, "t1", 1, 0, 1100)], now=10.0)
    assert kinds(res) == []


def test_kafka_one_partition_orders_by_offset_whatever_the_timestamps():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 0.0, 1.0), "b", "K", 2)
    res = check(L, [kafka_line(b, "t1", 0, 7, 1100), kafka_line(a, "t1", 0, 8, 1100)], now=10.0)
    assert kinds(res) == ["order"]
    # A duplicate of id 2 after id 1, in another topic: the first deliveries decide.
    res = check(L, [kafka_line(a, "t1", 0, 7, 1100), kafka_line(b, "t1", 0, 8, 1100),
                    kafka_line(b, "t2", 2, 0, 1050)], now=10.0)
    assert kinds(res) == ["order"]
    res = check(L, [kafka_line(a, "t1", 0, 7, 1100), kafka_line(b, "t1", 0, 8, 1100),
                    kafka_line(b, "t2", 2, 0, 1300)], now=10.0)
    assert kinds(res) == []


def test_kafka_a_late_topic_holds_its_event_and_its_keys_later_events_and_no_other_key():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 1.0, 1.1), "b", "K", 2)
    c = row(L, txn(L, "x", 1.0, 1.1), "c", "J", 3)
    ready = 2.5 + 3.5       # its topic ready at 2.5 s, plus the retry's allowance
    holds = {"a": (ready, "topic created late")}
    ok = [kafka_line(a, "late", 0, 0, 7000), kafka_line(b, "t1", 0, 0, 7100), kafka_line(c, "t1", 1, 0, 1200)]
    res = check(L, ok, now=10.0, holds=holds)
    assert kinds(res) == []
    assert res.stats["held_by_sink"] == 1
    # Past the hold plus the budget: late; the other key is not held by it.
    late = [kafka_line(a, "late", 0, 0, 8200), kafka_line(b, "t1", 0, 0, 8300), kafka_line(c, "t1", 1, 0, 3200)]
    assert kinds(check(L, late, now=10.0, holds=holds)) == ["late", "late", "late"]
    # A topic not created yet: neither it nor its key's later events are demanded; other keys are.
    res = check(L, [], now=10.0, holds={"a": (float("inf"), "not created yet")})
    assert kinds(res) == ["missing"] and res.violations[0].uids == ["c"]


def test_kafka_a_poison_key_held_by_a_late_topic_may_be_dead_lettered():
    L = Ledger()
    _, b = poison_pair(L, "2", b_commit=(1.0, 1.1))
    why = {"a": "its outcome (retry) could not be written: ... (SQLSTATE 23514)"}
    res = check(L, [kafka_line(b, "t1", 0, 0, 1300)], now=10.0, holds={"a": (4.0, "late topic")}, dead=why)
    assert kinds(res) == []
    # Without the hold (no reason it failed): a violation, and the row counts as not delivered.
    assert kinds(check(L, [kafka_line(b, "t1", 0, 0, 1300)], now=10.0, dead=why)) == ["dead_lettered", "missing",
                                                                                         "order"]


def test_an_undelivered_lower_id_counts_only_against_a_delivery_before_the_horizon():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    b = row(L, txn(L, "x", 0.0, 1.0), "b", "K", 2)
    # b's record was read, a's (another partition, appended earlier) not yet: the reader's horizon
    # (every record appended before it has been read) is below b's append time.
    assert kinds(check(L, [kafka_line(b, "t2", 0, 0, 1100)], now=1.05)) == []
    assert kinds(check(L, [kafka_line(b, "t2", 0, 0, 1100)], now=1.2)) == ["order"]


def test_kafka_eos_a_duplicate_is_a_violation_only_when_asked():
    L = Ledger()
    a = row(L, txn(L, "x", 0.0, 1.0), "a", "K", 1)
    twice = [kafka_line(a, "t1", 0, 0, 1100), kafka_line(a, "t1", 0, 1, 1200)]
    assert kinds(check(L, twice, now=10.0)) == []
    assert kinds(check(L, twice, now=10.0, no_duplicates=True)) == ["duplicate"]
