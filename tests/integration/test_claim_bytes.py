"""A claim is bounded by bytes as well as by rows (schema 12): a writer of large events cannot run
the relay out of memory. Before it, a claim returned up to batch_size rows whatever their size and
the relay held about twice that (bench/RESULTS.md, "What a claim of large events costs in memory").
"""
from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from conftest import base_config, wait_until

ALL_LANES = "(SELECT array_agg(g::smallint) FROM generate_series(0, 63) AS g)"


def claim(db, max_bytes, limit=100):
    """Calls the claim function as a relay's drain from the start does; returns (ids, lane bounds)."""
    rows = db.query(f"SELECT id, lane_bounds FROM outbox_claim('test', 60000, {ALL_LANES}, %s, 0, false, '{{}}', "
                    "'[]', false, -1, NULL, NULL, 'infinity', %s)", (limit, max_bytes))
    ids = [r[0] for r in rows if r[0] is not None]
    bounds = [r[1] for r in rows if r[0] is None][0]
    return ids, bounds


def insert(db, payloads, keys=3):
    """In one transaction: a poll finds them all at once."""
    with db.connect() as conn, conn.transaction():
        return [conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', %s, %s) "
                             "RETURNING id", (f"k{i % keys}", json.dumps(p))).fetchone()[0]
                for i, p in enumerate(payloads)]


def noise(n: int) -> str:
    """n characters that do not compress."""
    return base64.b64encode(os.urandom(n * 3 // 4 + 3)).decode()[:n]


def halves(n: int) -> str:
    """n characters, each 64-character chunk twice: stored compressed in about half as many bytes."""
    return "".join(noise(64) * 2 for _ in range(n // 128))


def test_the_claim_function_cuts_at_the_bytes_and_bounds_every_lane_there(db):
    ids = insert(db, [{"pad": noise(100_000)} for _ in range(6)])
    # 100 kB each: the bytes before the 4th are 300 kB and more, so it and the rest wait.
    got, bounds = claim(db, 300_000)
    assert got == ids[:3]
    assert set(bounds) == {ids[2]}, "a cut claim's bounds stop at its last row, in every lane"
    # The next claim from the start takes the rest (the first three are leased now).
    got, bounds = claim(db, 300_000)
    assert got == ids[3:]
    assert len(set(bounds)) == 1 and bounds[0] >= ids[-1]
    # The first row always goes, however small the bound.
    more = insert(db, [{"pad": noise(50_000)} for _ in range(2)])
    got, _ = claim(db, 1)
    assert got == more[:1]
    # NULL: no bound.
    last = insert(db, [{"pad": noise(50_000)} for _ in range(3)])
    got, _ = claim(db, None)
    assert got == more[1:] + last


def test_a_compressed_payload_counts_as_the_most_it_can_stand_for(db):
    # 600,000 characters in pairs of one 64-character chunk: stored compressed (pglz) in about half
    # as many bytes. As its text it would leave room for the next event under 10 MB; as the most its
    # stored bytes can stand for (88 times, pglz), it does not.
    big, small = insert(db, [{"pad": halves(600_000)}, {"pad": "x"}])
    stored, compression = db.query("SELECT pg_column_size(payload), pg_column_compression(payload) "
                                   "FROM outbox_events WHERE id = %s", (big,))[0]
    assert compression == "pglz" and 200_000 < stored < 500_000, (stored, compression)
    got, _ = claim(db, 10_000_000)
    assert got == [big]
    got, _ = claim(db, 10_000_000)
    assert got == [small]


def memory_mib(pid: int, field: str) -> float:
    """A field of /proc/<pid>/status in MiB: VmRSS (now) or VmHWM (the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field}")


@pytest.mark.parametrize("kind", ["noise", "halves"])
def test_a_relay_holds_a_few_times_the_window_not_the_backlog(db, relays, workdir, kind):
    """96 MiB of pending events (24 of 4 MiB, 6 keys), relay.in_flight_bytes 4 MiB: the relay's
    memory grows by a few times the window, both in a drain from the start (the claim function)
    and in polls (the lean poll); every event arrives once, in key order. bb94e5e (claims bounded
    by rows) grew by ~200 MiB here. Payloads that do not compress, and payloads stored compressed
    (which count as the most they can stand for: one to a claim)."""
    pad = noise if kind == "noise" else halves
    out = workdir / "events.jsonl"
    config = base_config(db, [{"name": "f", "type": "file", "path": str(out), "fsync": False}],
                         in_flight_bytes=4 << 20)
    growth = []
    expected = []
    for phase in ("drain", "poll"):
        if phase == "drain":
            expected += insert(db, [{"pad": pad(4 << 20)} for _ in range(24)], keys=6)
        relay = relays(config)
        relay.wait_log("ordering lanes rebalanced")
        base = memory_mib(relay.proc.pid, "VmRSS")
        if phase == "poll":
            time.sleep(1)
            expected += insert(db, [{"pad": pad(4 << 20)} for _ in range(24)], keys=6)
        wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0,
                   timeout=120, message="every event delivered")
        growth.append(memory_mib(relay.proc.pid, "VmHWM") - base)
        assert relay.stop() == 0
        # Nothing failed on the way (a claim that errors is retried after a reconnect, from the start).
        assert not [l for l in relay.logs() if l.get("level") in ("warn", "error")], phase
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [line["id"] for line in lines]
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids)), "every event once"
    last = {}
    for line in lines:
        assert line["id"] > last.get(line["key"], 0), f"key {line['key']}: {line['id']} after {last[line['key']]}"
        last[line["key"]] = line["id"]
    print(f"relay memory growth over 96 MiB of 4 MiB events ({kind}), window 4 MiB: drain {growth[0]:.0f} MiB, "
          f"polls {growth[1]:.0f} MiB")
    assert max(growth) < 64, f"the relay grew by {growth} MiB"


def test_a_poll_cuts_by_bytes_only_when_its_events_do_not_fit(db, relays, workdir):
    """The lean poll's usual form returns its rows whole when they fit in the window (255 times
    their stored sizes, or else their bytes as the cut counts them), and runs the form that cuts
    only when they do not: the cut cost ~55 us of Postgres CPU a poll of 8 small events. Which form
    ran, read from the server's log of the relay's worker session (log_min_duration_statement 0)."""
    with db.connect() as conn:
        conn.execute(f"ALTER DATABASE {db.name} SET log_min_duration_statement = 0")
    out = workdir / "events.jsonl"
    relay = relays(base_config(db, [{"name": "f", "type": "file", "path": str(out), "fsync": False}],
                               in_flight_bytes=1 << 20))
    relay.wait_log("ordering lanes rebalanced")
    worker = db.scalar("SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-relay worker' "
                       "AND datname = current_database()")
    log = Path(db.cluster.dir) / "server.log"
    start = log.stat().st_size

    def forms():
        """How many times each poll form ran in the worker session since the test began."""
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        lines = [line for line in text.splitlines() if f"[{worker}] LOG:" in line]
        return {form: sum(1 for line in lines if f"execute {form}:" in line)
                for form in ("poll_lanes", "poll_lanes_cutting", "poll_lanes_skipping")}

    def delivered(n):
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) == n, timeout=60,
                   message=f"{n} events delivered")

    # Small events, a commit each; then 100 rows of 1 KB in one commit (255 times their sizes is
    # 25 MiB, their bytes 100 KiB): whole, from the usual form.
    for i in range(20):
        insert(db, [{"n": i}])
        time.sleep(0.02)
    insert(db, [{"pad": noise(1000)} for _ in range(100)], keys=10)
    delivered(120)
    seen = forms()
    assert seen["poll_lanes"] > 0 and seen["poll_lanes_cutting"] == 0, seen
    # 40 events of 100 KB in one commit: 4 MB, four times the window; the form that cuts runs.
    insert(db, [{"pad": noise(100_000)} for _ in range(40)], keys=10)
    delivered(160)
    seen = forms()
    assert seen["poll_lanes_cutting"] > 0, seen
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({line["id"] for line in lines}) == 160, "every event once"
    last = {}
    for line in lines:
        assert line["id"] > last.get(line["key"], 0), f"key {line['key']}: {line['id']} after {last[line['key']]}"
        last[line["key"]] = line["id"]
