"""The fuzzer's own record of what it did: every transaction it ran (main database or its copy),
every row it wrote (by the unique `uid` in the payload), every lock it took on a pending row, and
every disruption (relay killed / stopped, Postgres restarted, sequence caching, TRUNCATE).

Times are time.monotonic(); `t0` is the run's start, for printing."""
from __future__ import annotations

import itertools
import threading
import time

INF = float("inf")
# Keys whose retry an operator's constraint refuses (writers.SETUP_SQL): a failed attempt at one of
# their events cannot be recorded (SQLSTATE 23514), so the relay must dead-letter the row with the
# reason and let every other key, and the key's later events, go on (issue 42's seventh hole).
POISON_PREFIX = "poison-"


class Txn:
    __slots__ = ("tid", "behaviour", "thread", "db", "kind", "start", "end", "outcome", "gid", "lock_uid",
                 "lock_start", "note", "epoch", "rows", "prepared_at")

    def __init__(self, tid, behaviour, thread, db, kind, epoch):
        self.tid, self.behaviour, self.thread, self.db, self.kind = tid, behaviour, thread, db, kind
        self.start = time.monotonic()
        self.end = None          # monotonic time it was known to have ended (COMMIT returned, ...)
        self.outcome = None      # 'committed' | 'rolled_back' | 'unknown' (an error: resolved later)
        self.gid = None
        self.prepared_at = None  # PREPARE TRANSACTION returned: from then on it holds only its lanes
        self.lock_uid = None     # a locker: the uid of the row it locked
        self.lock_start = None   # ... and when it asked for the lock
        self.note = ""
        self.epoch = epoch
        self.rows = []


class Row:
    __slots__ = ("uid", "key", "topic", "headers", "txn", "epoch", "intent", "id", "behaviour", "resolved")

    def __init__(self, uid, key, topic, headers, txn, epoch, behaviour):
        self.uid, self.key, self.topic, self.headers = uid, key, topic, headers
        self.txn, self.epoch, self.behaviour = txn, epoch, behaviour
        self.intent = "commit"   # 'rollback': inside a savepoint that was rolled back
        self.id = None           # known from RETURNING or a read back after commit
        self.resolved = None     # for an 'unknown' transaction: what the table said at the end

    @property
    def outcome(self) -> str | None:
        """'committed', 'rolled_back', 'unknown', 'foreign' (another database) or None (still open)."""
        if self.txn.db != "main":
            return "foreign"
        if self.intent == "rollback":
            return "rolled_back"
        o = self.txn.outcome
        if o == "unknown" and self.resolved:
            return self.resolved
        return o

    @property
    def commit_time(self):
        return self.txn.end


class Window:
    """A disruption: from `start` to `end` (when it stopped), after which events may take the usual
    latency budget from `release_at` on. None while it lasts."""
    __slots__ = ("kind", "start", "end", "release_at", "info")

    def __init__(self, kind, info=""):
        self.kind, self.info = kind, info
        self.start = time.monotonic()
        self.end = None
        self.release_at = None


class Truncate:
    __slots__ = ("start", "end", "epoch_before")

    def __init__(self, start, end, epoch_before):
        self.start, self.end, self.epoch_before = start, end, epoch_before


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self._tid = itertools.count(1)
        self.txns: list[Txn] = []
        self.rows: dict[str, Row] = {}
        self.windows: list[Window] = []
        self.truncates: list[Truncate] = []
        self.epoch = 0
        self.behaviour_runs: dict[str, int] = {}
        self.behaviour_errors: dict[str, dict] = {}
        self.notes: list[tuple] = []   # (time, text): things a reader of a failure wants to know
        self.fuzzer_errors: list[tuple] = []   # (time, behaviour, traceback): bugs of the fuzzer

    # --- transactions and rows

    def begin(self, behaviour, thread, db="main", kind="write", epoch=None) -> Txn:
        with self.lock:
            t = Txn(next(self._tid), behaviour, thread, db, kind, self.epoch if epoch is None else epoch)
            self.txns.append(t)
            return t

    def row(self, txn: Txn, uid, key, topic, headers) -> Row:
        r = Row(uid, key, topic, headers, txn, txn.epoch, txn.behaviour)
        with self.lock:
            assert uid not in self.rows, uid
            self.rows[uid] = r
            txn.rows.append(r)
        return r

    def end(self, txn: Txn, outcome: str, when=None):
        if txn.end is not None:
            return
        txn.end = time.monotonic() if when is None else when
        txn.outcome = outcome

    # --- disruptions

    def window(self, kind, info="") -> Window:
        w = Window(kind, info)
        with self.lock:
            self.windows.append(w)
        return w

    def note(self, text):
        with self.lock:
            self.notes.append((time.monotonic(), text))

    def ran(self, behaviour):
        with self.lock:
            self.behaviour_runs[behaviour] = self.behaviour_runs.get(behaviour, 0) + 1

    def error(self, behaviour, exc):
        name = type(exc).__name__
        with self.lock:
            d = self.behaviour_errors.setdefault(behaviour, {})
            d[name] = d.get(name, 0) + 1

    def rel(self, t) -> str:
        return "-" if t is None else ("open" if t == INF else f"{t - self.t0:7.3f}")

    def snapshot(self):
        with self.lock:
            return list(self.txns), dict(self.rows), list(self.windows), list(self.truncates)
