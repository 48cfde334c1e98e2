"""The checker: the ledger against what the relays' file sinks got. Runs on a partial history (during
the run, only what is already due is demanded) or on the whole one (after the grace period).

Rules:
- every committed uid is delivered (some relay's file) at least once; no rolled-back uid, no uid of
  the other database, nothing the fuzzer did not write; each line's key, topic and headers are the
  row's;
- per key, within an epoch (TRUNCATE ... RESTART IDENTITY starts a new one), first deliveries come
  in id order. A line's delivery instant lies in [lo, hi] (the tailer's reads); within one file the
  file's order is exact; across files b is before a only when provably so (b.hi < a.lo). A committed
  event not delivered at all counts as delivered after everything. Kafka (--sinks kafka): a "file"
  is a topic's partition (its offsets are exact); across partitions the records' LogAppendTime
  decides, to the millisecond (harness.kafka_interval): an earlier millisecond is before, the same
  one is ambiguous (not a violation);
- each committed event is delivered within `budget` seconds of its release: max(its commit, the end
  of every transaction of the fuzzer in this database open at its commit, the end of a lock on it
  taken before it was delivered, the release of every disruption (relay killed / stopped, Postgres
  restarted, sequence caching) overlapping its wait, its last failed attempt at a webhook plus the
  retry's backoff, the end of every transaction that began after its commit but before the relay
  that delivered it took a reading of the writers whose last id reached its id, at most
  READING_CAP after its commit), and never before an earlier event of its key is due (head of
  line). A row the sink could not take before some time (`holds`: its Kafka topic created late) is
  released no earlier than that (the time includes the retry's allowance). An event
  whose epoch was truncated before it was due is not demanded;
- a row is dead-lettered only when an attempt at it failed and its key is a poison key (an
  operator's constraint refuses its retry: the failed attempt cannot be recorded), or when the
  webhook receiver refused it (a 422 to a request that carried it alone); such a row is not
  demanded, but its first attempt is due by its deadline as a delivery would be, and its key's
  later events follow it as if it had been retried. A key of any length
  is retried (schema 13).
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from ledger import INF, POISON_PREFIX

# A relay reads the writers every 25-100 ms while it holds events back (LaneBounds::ReadingPace);
# one that takes no reading for this long after an event's commit is a defect, whatever its logs.
READING_CAP = 1.0


class Violation:
    __slots__ = ("kind", "text", "uids", "keys", "times", "suspects", "sig")

    def __init__(self, kind, text, uids=(), keys=(), times=(), suspects=(), sig=None):
        self.kind, self.text = kind, text
        self.uids, self.keys, self.times = list(uids), list(keys), [t for t in times if t is not None and t != INF]
        self.suspects = list(suspects)
        self.sig = sig or (kind, tuple(self.uids))


class Result:
    def __init__(self):
        self.violations: list[Violation] = []
        self.stats = {}
        self.deadline = {}
        self.release_reason = {}


def _slot(line):
    """The relay slot of a sink line (its file or webhook path is relayN), or None."""
    name = getattr(line, "file", None) or ""
    return int(name[5:]) if name.startswith("relay") and name[5:].isdigit() else None


def _short(key, n=24):
    return key if len(key) <= n else f"{key[:n]}...({len(key)} chars)"


def retry_allowance(failed_attempts: int) -> float:
    """How long after a failed attempt its retry may come: the fuzz relays' backoff (100 ms
    doubling, equal jitter, capped at 2 s) for that attempt."""
    return min(2.0, 0.1 * 2 ** (failed_attempts - 1))


def check(ledger, lines, now, budget=2.0, final=False, relay_exits=(), bad_lines=(), shrunk=(),
          table_uids=None, max_pairs_per_key=5, lanes=None, failures=None, dead=None,
          readings=None, holds=None, no_duplicates=False, refused=None):
    """lines: the tailer's SinkLines. table_uids (final): {uid: id} of the main table's rows now.
    failures: {uid: [monotonic times of failed attempts]}; dead: {uid: last_error} of the rows
    dead-lettered so far. readings: the relays' readings of the writers (harness.Reading; None:
    every transaction that began after an event's commit is told apart from those open at it).
    holds: {uid: (monotonic time, why)}: the sink could not take the row before that time (its Kafka
    topic did not exist yet, plus the retry's allowance; INF: not yet created), so it is released
    no earlier; such a row may have failed attempts (a dead letter of a poison key is accepted).
    no_duplicates (kafka-eos): a uid delivered twice is a violation. refused: the uids the webhook
    receiver refused alone (their refusals are in failures): their dead letters are accepted."""
    res = Result()
    V = res.violations
    txns, rows, windows, truncates = ledger.snapshot()

    # --- deliveries by uid
    occ = defaultdict(list)                       # uid -> [SinkLine]
    for ln in lines:
        rec = ln.rec
        payload = rec.get("payload")
        uid = payload.get("uid") if isinstance(payload, dict) else None
        r = rows.get(uid) if uid is not None else None
        if r is None:
            V.append(Violation("unknown_delivered", f"{ln.file} line {ln.index}: id {rec.get('id')} key "
                               f"{_short(str(rec.get('key')))!r} uid {uid!r}: the fuzzer wrote no such row",
                               times=[ln.hi], sig=("unknown_delivered", ln.file, ln.index)))
            continue
        occ[uid].append(ln)

    for uid, lst in occ.items():
        r = rows[uid]
        o = r.outcome
        first = min(lst, key=lambda x: x.lo)
        if o == "foreign":
            V.append(Violation("foreign_delivered", f"uid {uid} (key {_short(r.key)!r}) was written in the other "
                               f"database, yet {first.file} delivered it (id {first.rec.get('id')})",
                               uids=[uid], keys=[r.key], times=[r.txn.start, first.hi], suspects=["other_db"]))
            continue
        if o == "rolled_back":
            V.append(Violation("rolled_back_delivered", f"uid {uid} (key {_short(r.key)!r}, id "
                               f"{first.rec.get('id')}, {r.behaviour}) was rolled back, yet {first.file} delivered it",
                               uids=[uid], keys=[r.key], times=[r.txn.start, r.txn.end, first.hi],
                               suspects=[r.behaviour]))
            continue
        ids = {ln.rec.get("id") for ln in lst}
        if r.id is None and len(ids) == 1:
            r.id = next(iter(ids))
        bad = [ln for ln in lst if ln.rec.get("key") != r.key or ln.rec.get("topic") != r.topic
               or (r.headers and ln.rec.get("headers") != r.headers) or (r.id is not None and ln.rec.get("id") != r.id)]
        if bad:
            ln = bad[0]
            V.append(Violation("content", f"uid {uid}: {ln.file} delivered id {ln.rec.get('id')} key "
                               f"{_short(str(ln.rec.get('key')))!r} topic {ln.rec.get('topic')!r} headers "
                               f"{ln.rec.get('headers')}; written: id {r.id} key {_short(r.key)!r} topic {r.topic!r} "
                               f"headers {r.headers}", uids=[uid], keys=[r.key], times=[ln.hi]))

    if no_duplicates:
        for uid, lst in occ.items():
            if len(lst) > 1:
                r = rows[uid]
                V.append(Violation("duplicate", f"uid {uid} (key {_short(r.key)!r}, id {r.id}, {r.behaviour}) delivered "
                                   f"{len(lst)} times: " + ", ".join(f"{ln.file}@{ln.index}" for ln in lst[:4]),
                                   uids=[uid], keys=[r.key], times=[ln.lo for ln in lst], sig=("duplicate", uid)))

    # --- which rows count as committed
    def committed(r):
        o = r.outcome
        if o == "committed":
            return True
        if o == "unknown" and r.uid in occ:
            return True    # delivered: it committed
        if o == "unknown" and table_uids is not None and r.epoch == ledger.epoch:
            return r.uid in table_uids
        return False

    crow = [r for r in rows.values() if r.txn.db == "main" and r.txn.end is not None and committed(r)]
    failures, dead, holds, refused = failures or {}, dead or {}, holds or {}, refused or set()
    dead_ok = set()
    for uid, why in dead.items():
        r = rows.get(uid)
        if r is None:
            V.append(Violation("unknown_delivered", f"dead-lettered uid {uid!r}: the fuzzer wrote no such row",
                               sig=("unknown_dead", uid)))
        elif (failures.get(uid) or uid in holds) and (r.key.startswith(POISON_PREFIX) or uid in refused):
            dead_ok.add(uid)
        else:
            V.append(Violation("dead_lettered", f"uid {uid} (key {_short(r.key)!r}, {len(r.key.encode())} bytes, id {r.id}, "
                               f"{r.behaviour}, {len(failures.get(uid, ()))} failed attempts) was dead-lettered: {why}",
                               uids=[uid], keys=[r.key], times=[r.txn.end] + failures.get(uid, [])))
    # A dead letter that a TRUNCATE removed before the relay wrote it: once a refusal is final the
    # relay sends the key's later events on, and writes the dead letter with the batch's outcomes
    # (up to ~50 ms later); a TRUNCATE in between leaves no trace of it (seed 881011462: refused at
    # 19.364, its key's next event delivered at 19.412, the table truncated before the outcome).
    truncated_at = {tr.epoch_before: tr.start for tr in truncates}
    for uid in refused - dead.keys():
        r, f = rows.get(uid), failures.get(uid)
        if r is not None and f and truncated_at.get(r.epoch, -INF) > f[-1]:
            dead_ok.add(uid)
    if table_uids is not None:
        for r in crow:
            if r.id is None and r.uid in table_uids:
                r.id = table_uids[r.uid]

    # --- release times
    # A prepared transaction draws no more ids: from its PREPARE on it holds only the lanes of its
    # own rows (checked apart below, lane by lane); before that it holds like any other.
    lanes = lanes or {}
    prepared = sorted((t for t in txns if t.db == "main" and t.prepared_at is not None), key=lambda t: t.start)
    prepared_starts = [t.start for t in prepared]
    holders = sorted((t for t in txns if t.db == "main" and t.prepared_at is None), key=lambda t: t.start)
    starts = [t.start for t in holders]
    prefix, m, who = [], -INF, []
    for t in holders:
        e = INF if t.end is None else t.end
        if e > m:
            m = e
            who_t = t
        prefix.append(m)
        who.append(who_t)

    first_lo = {uid: min(x.lo for x in lst) for uid, lst in occ.items()}
    first_delivery = {uid: min(lst, key=lambda x: x.lo) for uid, lst in occ.items()}
    # Each relay's readings (all its incarnations: a new one's first reading knows nothing older,
    # which the relay_kill window covers), by the time the line was seen; an epoch's readings
    # only (the ids start again after a TRUNCATE ... RESTART IDENTITY).
    by_slot = defaultdict(list)
    for q in readings or ():
        by_slot[q.slot].append(q)
    for lst in by_slot.values():
        lst.sort(key=lambda q: q.hi)
    slot_his = {s: [q.hi for q in lst] for s, lst in by_slot.items()}
    epoch_start = {tr.epoch_before + 1: (INF if tr.end is None else tr.end) for tr in truncates}

    def reading_after(slot, r):
        """When relay `slot` had read the writers with a last id at or above r's id: the line's hi,
        or the commit plus READING_CAP if later."""
        cap = r.txn.end + READING_CAP
        lst = by_slot.get(slot, ())
        begin = epoch_start.get(r.epoch, -INF)
        for q in lst[bisect.bisect_right(slot_his.get(slot, ()), r.txn.start):]:
            if q.hi >= cap:
                break
            if q.cache == 1 and q.lo > begin and q.last_id >= r.id:
                return q.hi
        return cap
    first_hi = {uid: min(x.hi for x in lst) for uid, lst in occ.items()}
    rel, reason = {}, {}
    poison_rel = {}       # dead-lettered poison rows: their failed attempt and the retry's backoff
    held_later = set()    # events a writer that began after their commit holds (the reading rule)
    for r in crow:
        c = r.txn.end
        x = c
        why = "commit"
        i = bisect.bisect_left(starts, c) - 1
        if i >= 0 and prefix[i] > x:
            x = prefix[i]
            h = who[i]
            why = f"txn {h.tid} ({h.behaviour}, {h.db}) open at its commit"
        for p in prepared:
            if not p.start < c < (INF if p.end is None else p.end):
                continue
            own = {lanes.get(q.key) for q in p.rows}
            if p.prepared_at > c or None in own or lanes.get(r.key) is None or lanes.get(r.key) in own:
                e = INF if p.end is None else p.end
                if e > x:
                    x = e
                    why = f"txn {p.tid} ({p.behaviour}, {p.db}) open at its commit"
        if readings is not None and r.id is not None:
            # A writer first seen by a relay's reading drew only ids above the last id of the
            # reading before (LaneBounds::resolve_below_new_writers): one that began after the
            # commit but before the delivering relay's first reading that reached this id cannot
            # be told from one open at the commit, and holds the event as such.
            slot = _slot(first_delivery.get(r.uid))
            told = reading_after(slot, r) if slot is not None else max(
                (reading_after(s, r) for s in by_slot), default=c + READING_CAP)
            i = bisect.bisect_left(starts, told) - 1
            later = [who[i]] if i >= 0 and prefix[i] > x else []
            j = bisect.bisect_right(prepared_starts, c)
            later += [p for p in prepared[j:bisect.bisect_left(prepared_starts, told)]
                      if (INF if p.end is None else p.end) > x]
            for t in later:
                e = INF if t.end is None else t.end
                if e > x:
                    x = e
                    held_later.add(r.uid)
                    why = (f"txn {t.tid} ({t.behaviour}) began {t.start - c:.3f} s after its commit, before a "
                           f"reading of relay{slot if slot is not None else '?'} reached its id")
        f = failures.get(r.uid)
        if f and r.uid in dead_ok:
            # Dead-lettered at its failed attempt: its own deadline is for that attempt; its key's
            # later events wait for it as for a retry (head_of_line()).
            poison_rel[r.uid] = f[-1] + retry_allowance(len(f))
        elif f and f[-1] + retry_allowance(len(f)) > x:
            x = f[-1] + retry_allowance(len(f))
            why = f"its failed attempt {len(f)} at {ledger.rel(f[-1])} and the retry's backoff"
        h = holds.get(r.uid)
        if h and h[0] > x:
            x, why = h
        rel[r.uid] = x
        reason[r.uid] = why
    # A share-locked pending row stops its lane there until the lock goes (the claim skips it and
    # takes nothing of the lane above it): every later undelivered event of its lane waits.
    by_lane = defaultdict(list)
    for r in crow:
        if r.id is not None:
            by_lane[(r.epoch, lanes.get(r.key, r.key))].append(r)
    for t in txns:
        if t.lock_uid and t.lock_uid in rel:
            p = rows[t.lock_uid]
            hi = first_hi.get(t.lock_uid)
            if hi is not None and hi < t.lock_start:
                continue     # delivered before the lock: it holds nothing
            e = INF if t.end is None else t.end
            for y in by_lane.get((p.epoch, lanes.get(p.key, p.key)), ()) if p.id is not None else (p,):
                if y.id is not None and p.id is not None and y.id < p.id:
                    continue
                hy = first_hi.get(y.uid)
                if hy is not None and hy < t.lock_start:
                    continue
                if e > rel[y.uid]:
                    rel[y.uid] = e
                    reason[y.uid] = f"uid {p.uid} of its lane locked by txn {t.tid} ({t.behaviour})"

    wins = sorted(windows, key=lambda w: w.start)
    by_key = defaultdict(list)
    for r in crow:
        if r.id is not None:
            by_key[(r.epoch, r.key)].append(r)
    for lst in by_key.values():
        lst.sort(key=lambda r: r.id)

    main_txns = sorted((t for t in txns if t.db == "main"), key=lambda t: t.start)

    def apply_windows():
        for r in crow:
            x = rel[r.uid]
            c = r.txn.end
            for w in wins:
                if w.start > x + budget:
                    break
                w_end = INF if w.end is None else w.end
                w_rel = INF if w.release_at is None else w.release_at
                if w_end <= c:
                    continue
                if w_rel > x:
                    x = w_rel
                    reason[r.uid] = f"{w.kind} window {ledger.rel(w.start)}..{ledger.rel(w.release_at)}"
                # No reading could be taken between the commit and the window's release: a writer
                # that began in between cannot be told from one open at the commit, and holds the
                # event as such a writer would, also when something else held it past the release
                # (found by a 30-minute run: a writer prepared during a relay's SIGSTOP held an
                # event that a transaction open at its commit held past the stop).
                for t in main_txns:
                    if t.start >= w_rel:
                        break
                    e = INF if t.end is None else t.end
                    if t.start > c and e > x:
                        x = e
                        reason[r.uid] = (f"txn {t.tid} ({t.behaviour}) began in the {w.kind} window "
                                         f"{ledger.rel(w.start)}..{ledger.rel(w.release_at)} after its commit")
            rel[r.uid] = x

    def head_of_line():
        for lst in by_key.values():
            m, src = -INF, None
            for r in lst:
                if rel[r.uid] < m:
                    rel[r.uid] = m
                    reason[r.uid] = f"head of line: {src}"
                elif rel[r.uid] > m:
                    m, src = rel[r.uid], f"uid {r.uid} (id {r.id}): {reason[r.uid]}"
                if poison_rel.get(r.uid, -INF) > m:
                    m, src = poison_rel[r.uid], f"uid {r.uid} (id {r.id}): dead-lettered at its failed attempt"

    for _ in range(2):
        apply_windows()
        head_of_line()

    deadline = {uid: x + budget for uid, x in rel.items()}
    res.deadline, res.release_reason = deadline, reason

    # --- delivered on time, at all
    def suspects(at, until):
        """Behaviours of the transactions (either database) open at `at`, other than holders counted
        already (those ended before `at`): what may have held the event back."""
        out = set()
        for t in txns:
            if t.start < at and (t.end is None or t.end > at):
                out.add(t.behaviour if t.db == "main" else f"{t.behaviour}({t.kind if t.kind != 'write' else 'copy'})")
        for w in wins:
            if w.start < until and (w.end is None or w.end > at):
                out.add(w.kind)
        return sorted(out)

    late_n = missing_n = 0
    margin = 0.05
    for r in crow:
        d = deadline[r.uid]
        if d == INF:
            continue
        cut = truncated_at.get(r.epoch)
        if cut is not None and d >= cut:
            continue     # its epoch was truncated before it was due: not demanded
        if r.uid in dead_ok:
            # Not delivered, by design; but its (first) attempt is due as a delivery would be.
            f = failures.get(r.uid)
            if f and f[0] > d + margin:
                late_n += 1
                V.append(Violation("late", f"uid {r.uid} (key {_short(r.key)!r}, id {r.id}, {r.behaviour}), "
                                   f"dead-lettered, first attempted {f[0] - r.txn.end:.2f} s after its commit, "
                                   f"{f[0] - d:.2f} s past its deadline (release: {reason[r.uid]})",
                                   uids=[r.uid], keys=[r.key], times=[r.txn.start, r.txn.end, d - budget, f[0]],
                                   suspects=suspects(d, f[0]), sig=("late", r.uid)))
            continue
        if r.uid in occ:
            lo = first_lo[r.uid]
            if lo > d:
                late_n += 1
                V.append(Violation("late", f"uid {r.uid} (key {_short(r.key)!r}, id {r.id}, {r.behaviour}) delivered "
                                   f"{first_hi[r.uid] - r.txn.end:.2f} s after its commit, "
                                   f"{lo - d:.2f}+ s past its deadline (release: {reason[r.uid]})",
                                   uids=[r.uid], keys=[r.key], times=[r.txn.start, r.txn.end, d - budget, lo],
                                   suspects=suspects(d, lo), sig=("late", r.uid)))
        elif now > d + margin:
            missing_n += 1
            V.append(Violation("missing", f"uid {r.uid} (key {_short(r.key)!r}, id {r.id}, {r.behaviour}) committed at "
                               f"{ledger.rel(r.txn.end)}, not delivered {now - r.txn.end:.2f} s later (deadline "
                               f"{ledger.rel(d)}; release: {reason[r.uid]})",
                               uids=[r.uid], keys=[r.key], times=[r.txn.start, r.txn.end, d - budget],
                               suspects=suspects(d, now), sig=("late", r.uid)))

    # --- per key order of first deliveries
    def per_file(uid):
        d = {}
        for ln in occ.get(uid, ()):
            cur = d.get(ln.file)
            if cur is None or ln.index < cur[0]:
                d[ln.file] = (ln.index, ln.lo, ln.hi)
        return d

    def precedes(b, a, fb, fa):
        """Every delivery of a came after some delivery of b (so a's first came after b's first). An a
        not delivered (yet) comes after a b seen before `now` (every delivery before it is in
        `lines`: a's would be there too); a b seen later may have come after an a not read yet
        (the Kafka reader reads one partition ahead of another)."""
        if not fb:
            return False
        if not fa:
            return any(hib < now for _, _, hib in fb.values())
        for g, (ia, loa, _) in fa.items():
            ok = False
            if g in fb and fb[g][0] < ia:
                ok = True
            else:
                for f, (_, _, hib) in fb.items():
                    if f != g and hib < loa:
                        ok = True
                        break
            if not ok:
                return False
        return True

    order_n = 0
    locked = {t.lock_uid for t in txns if t.lock_uid}
    for (epoch, key), lst in by_key.items():
        lst = [r for r in lst if r.uid not in dead_ok]
        files = {r.uid: per_file(r.uid) for r in lst}
        lo_of = {r.uid: first_lo.get(r.uid, INF) for r in lst}
        sorted_lo, sorted_rows = [], []
        reported = 0
        for b in lst:
            fb = files[b.uid]
            if fb:
                j = bisect.bisect_left(sorted_lo, lo_of[b.uid])
                for a in sorted_rows[j:]:
                    if a.id >= b.id:
                        continue
                    if precedes(b, a, fb, files[a.uid]):
                        order_n += 1
                        if reported < max_pairs_per_key:
                            reported += 1
                            fa = files[a.uid]
                            a_when = (f"first delivered at {ledger.rel(first_hi[a.uid])} ({', '.join(fa)})" if fa
                                      else "not delivered (yet)")
                            V.append(Violation(
                                "order", f"key {_short(key)!r} epoch {epoch}: id {b.id} (uid {b.uid}, {b.behaviour}) "
                                f"delivered at {ledger.rel(first_hi[b.uid])} ({', '.join(fb)}) before id {a.id} "
                                f"(uid {a.uid}, {a.behaviour}, committed {ledger.rel(a.txn.end)}), {a_when}",
                                uids=[a.uid, b.uid], keys=[key],
                                times=[a.txn.start, a.txn.end, b.txn.end, first_hi.get(b.uid), first_hi.get(a.uid)],
                                suspects=[a.behaviour] + sorted({w.kind for w in wins if w.start < first_hi[b.uid]
                                                                 and (w.end is None or w.end > a.txn.start)}
                                                                | ({"locked"} if a.uid in locked else set())),
                                sig=("order", a.uid, b.uid)))
            k = bisect.bisect_right(sorted_lo, lo_of[b.uid])
            sorted_lo.insert(k, lo_of[b.uid])
            sorted_rows.insert(k, b)

    # --- the relays, the files
    for slot, pid, code, when in relay_exits:
        V.append(Violation("relay_exit", f"relay{slot} (pid {pid}) exited by itself with code {code}",
                           times=[when], sig=("relay_exit", pid)))
    for name, raw in bad_lines:
        V.append(Violation("bad_line", f"{name}: a line that is not JSON: {raw[:200]!r}", sig=("bad_line", name, raw[:50])))
    for name, (t, size, consumed) in shrunk:
        V.append(Violation("sink_cut", f"{name} shrank to {size} bytes below {consumed} already read (complete lines "
                           f"cut)", times=[t], sig=("sink_cut", name, consumed)))

    # --- the table agrees with the ledger (final, current epoch)
    if table_uids is not None:
        for r in rows.values():
            if r.txn.db != "main" or r.epoch != ledger.epoch:
                continue
            o = r.outcome
            if o == "committed" and r.uid not in table_uids:
                V.append(Violation("ledger", f"uid {r.uid} ({r.behaviour}) committed per the fuzzer, not in the table",
                                   uids=[r.uid], keys=[r.key]))
            elif o == "rolled_back" and r.uid in table_uids:
                V.append(Violation("ledger", f"uid {r.uid} ({r.behaviour}) rolled back per the fuzzer, yet in the table",
                                   uids=[r.uid], keys=[r.key]))

    main_txns = [t for t in txns if t.db == "main"]
    res.stats = {
        "transactions": len(main_txns),
        "transactions_committed": sum(1 for t in main_txns if t.outcome == "committed"),
        "transactions_rolled_back": sum(1 for t in main_txns if t.outcome == "rolled_back"),
        "transactions_unknown": sum(1 for t in main_txns if t.outcome == "unknown"),
        "transactions_other_db": sum(1 for t in txns if t.db != "main"),
        "events_written": len(rows),
        "events_committed": len(crow),
        "events_demanded": sum(1 for r in crow if deadline[r.uid] != INF and r.uid not in dead_ok and not (
            truncated_at.get(r.epoch) is not None and deadline[r.uid] >= truncated_at[r.epoch])),
        "events_rolled_back": sum(1 for r in rows.values() if r.outcome == "rolled_back"),
        "events_other_db": sum(1 for r in rows.values() if r.outcome == "foreign"),
        "events_delivered": sum(1 for uid in occ if rows[uid].outcome != "foreign"),
        "attempts_failed": sum(len(x) for x in failures.values()),
        "held_by_sink": sum(1 for r in crow if r.uid in holds),
        "dead_lettered": len(dead), "dead_lettered_poison_key": len(dead_ok - refused),
        "dead_lettered_refused": len(dead_ok & refused),
        "long_keys_delivered": sum(1 for uid in occ if len(rows[uid].key.encode()) > 2704),
        "long_keys_retried": sum(1 for uid in occ if len(rows[uid].key.encode()) > 2704 and failures.get(uid)),
        "lines": len(lines),
        "duplicates": sum(len(lst) - 1 for lst in occ.values()),
        "late": late_n, "missing": missing_n, "order_pairs": order_n,
        "epochs": ledger.epoch + 1,
        "readings": len(readings or ()), "held_by_later_writers": len(held_later),
    }
    return res
