"""Writer behaviours: each a small function registered in BEHAVIOURS (name -> weight, function).
A writer thread picks them at random from its own random.Random (seeded from the run's seed), with
random holds (0-1.5 s), keys, topics and sizes. Every row carries a unique `uid` in its payload and
is recorded in the ledger *before* the statement that writes it is sent; its outcome is recorded
when the transaction's end is known (an error makes it 'unknown': the table decides at the end)."""
from __future__ import annotations

import base64
import json
import random
import string
import threading
import time

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from harness import FastpathConn, mono
from ledger import POISON_PREFIX, Truncate

LARGE_SHARE = 0.005  # of the events, a large payload (and every row of a quarter of insert_multirow's)

SEQ = "outbox_events_id_seq"
INSERT_ONE = ("INSERT INTO outbox_events (topic, aggregate_id, payload, headers) VALUES (%s, %s, %s, %s) "
              "RETURNING id")
TOPICS = ["order.placed", "order.paid", "fuzz.event"]
HOT_KEYS = [f"k{n}" for n in range(10)] + ["", "ключ-1", "🔑", "a b"]
POISON_KEYS = [f"{POISON_PREFIX}{n}" for n in range(3)]

SETUP_SQL = [
    # Reads back by uid (COPY, INSERT ... SELECT, trigger, multi-statement rows).
    "CREATE INDEX fuzz_uid_idx ON outbox_events ((payload->>'uid'))",
    f"ALTER TABLE outbox_events ADD CONSTRAINT fuzz_no_retry_of_poison CHECK (attempts = 0 OR dead_lettered_at "
    f"IS NOT NULL OR processed_at IS NOT NULL OR left(aggregate_id, {len(POISON_PREFIX)}) <> '{POISON_PREFIX}') "
    "NOT VALID",
    "CREATE TABLE receipts (event_id bigint REFERENCES outbox_events (id))",
    "CREATE TABLE orders (id bigserial PRIMARY KEY, key text NOT NULL, uid text NOT NULL, amount integer)",
    """CREATE FUNCTION fuzz_orders_event() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO outbox_events (topic, aggregate_id, payload)
         VALUES ('order.placed', NEW.key, jsonb_build_object('uid', NEW.uid, 'b', 'trigger', 'order', NEW.id));
         RETURN NULL;
       END $$""",
    "CREATE TRIGGER fuzz_orders_event AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION fuzz_orders_event()",
    # A procedure that commits (and rolls back) inside: p_plan[i] is insert | commit | rollback | sleep.
    """CREATE PROCEDURE fuzz_proc(p_plan text[], p_keys text[], p_uids text[], p_sleep float8)
       LANGUAGE plpgsql AS $$
       BEGIN
         FOR i IN 1 .. coalesce(array_length(p_plan, 1), 0) LOOP
           IF p_plan[i] = 'commit' THEN COMMIT;
           ELSIF p_plan[i] = 'rollback' THEN ROLLBACK;
           ELSIF p_plan[i] = 'sleep' THEN PERFORM pg_sleep(p_sleep);
           ELSE
             INSERT INTO outbox_events (topic, aggregate_id, payload)
             VALUES ('fuzz.proc', p_keys[i], jsonb_build_object('uid', p_uids[i], 'b', 'procedure'));
           END IF;
         END LOOP;
       END $$""",
    # Called through PQfn (fastpath): its arguments come from session settings. The payload's subquery
    # sleeps after the id is drawn and before the lane is computed (test_writer_isolation's race).
    """CREATE FUNCTION fuzz_fp_insert() RETURNS integer LANGUAGE sql AS $$
       INSERT INTO outbox_events (topic, aggregate_id, payload)
       VALUES ('fuzz.fastpath', current_setting('fuzz.key'),
               (SELECT jsonb_build_object('uid', current_setting('fuzz.uid'), 'b', 'fastpath')
                FROM pg_sleep(current_setting('fuzz.sleep')::float8)))
       RETURNING id::integer $$""",
]


# ---------------------------------------------------------------------------------------------
# Shared state


class Gate:
    """Writers hold it shared for a whole behaviour; TRUNCATE holds it alone, so that every
    transaction of the fuzzer is wholly before or after a TRUNCATE (its epoch). Writer-preferring."""

    def __init__(self):
        self.cond = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting = 0

    def acquire_shared(self, timeout=30.0) -> bool:
        deadline = mono() + timeout
        with self.cond:
            while self.writer or self.waiting:
                if not self.cond.wait(max(0.0, deadline - mono())) and mono() >= deadline:
                    return False
            self.readers += 1
            return True

    def release_shared(self):
        with self.cond:
            self.readers -= 1
            self.cond.notify_all()

    def acquire_exclusive(self, timeout=30.0) -> bool:
        deadline = mono() + timeout
        with self.cond:
            self.waiting += 1
            try:
                while self.readers or self.writer:
                    if not self.cond.wait(max(0.0, deadline - mono())) and mono() >= deadline:
                        return False
                self.writer = True
                return True
            finally:
                self.waiting -= 1
                self.cond.notify_all()

    def release_exclusive(self):
        with self.cond:
            self.writer = False
            self.cond.notify_all()


class LateTopics:
    """--sinks kafka: row topics whose Kafka topic the fuzzer creates only 0.5-3 s after a writer
    first used one (the broker creates none itself): the relay gets UNKNOWN_TOPIC_OR_PART for such an
    event and must retry it while holding its key's later events (to topics that exist, other
    partitions) and letting other keys go. Writers pick a pending one for `rate` of their rows."""

    def __init__(self, rate=0.04):
        self.lock = threading.Lock()
        self.rate = rate
        self.pending = []          # names writers may pick now
        self.first_use = {}        # name -> monotonic time a writer first picked it
        self.names = set()         # every late topic so far

    def add(self, name):
        with self.lock:
            self.pending.append(name)
            self.names.add(name)

    def remove(self, name):
        with self.lock:
            if name in self.pending:
                self.pending.remove(name)

    def pick(self, rng):
        with self.lock:
            if not self.pending or rng.random() >= self.rate:
                return None
            name = rng.choice(self.pending)
            self.first_use.setdefault(name, mono())
            return name


class Shared:
    """What every writer thread sees."""

    def __init__(self, ledger, main_url, copy_url, fnid_main, fnid_copy, threads):
        self.ledger = ledger
        self.main_url, self.copy_url = main_url, copy_url
        self.fnid = {"main": fnid_main, "copy": fnid_copy}
        self.gate = Gate()
        self.stop = threading.Event()
        self.admin = threading.Lock()            # one of TRUNCATE / sequence caching at a time
        self.last_admin = {}                     # behaviour -> monotonic time it last ran
        self.conn_generation = 0                 # bumped: every writer closes its connections
        self.recycled = {}                       # thread index -> (generation, monotonic time)
        self.threads = threads
        self.prepared_slots = threading.BoundedSemaphore(12)   # max_prepared_transactions is 20
        self.long_keys = []
        self.dead_letters = {}                   # uid -> last_error, read just before each TRUNCATE
        self.late = None                         # LateTopics (--sinks kafka)


class Ctx:
    """One writer thread's state: its random.Random, its connections, its uid counter."""

    def __init__(self, shared: Shared, index: int, rng: random.Random):
        self.s = shared
        self.ledger = shared.ledger
        self.i = index
        self.rng = rng
        self.n = 0
        self.conns = {}
        self.fp = {}
        self.generation = 0
        self.large = False  # every payload large (payload())
        self.open = []
        self.behaviour = None

    # --- connections

    def conn(self, name="ac", db="main", autocommit=True) -> psycopg.Connection:
        key = (name, db)
        c = self.conns.get(key)
        if c is None or c.closed or c.broken:
            url = self.s.main_url if db == "main" else self.s.copy_url
            c = psycopg.connect(url, autocommit=autocommit, connect_timeout=10,
                                application_name=f"fuzz-w{self.i}-{name}",
                                options="-c lock_timeout=10s -c statement_timeout=30s")
            self.conns[key] = c
        return c

    def fastpath(self, db="main") -> FastpathConn:
        c = self.fp.get(db)
        if c is None or c.broken():
            if c is not None:
                c.close()
            url = self.s.main_url if db == "main" else self.s.copy_url
            c = FastpathConn(url)
            c.exec(f"SET application_name = 'fuzz-w{self.i}-fastpath'")
            c.exec("SET lock_timeout = '10s'")
            self.fp[db] = c
        return c

    def close_all(self):
        for c in self.conns.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self.conns.clear()
        for c in self.fp.values():
            c.close()
        self.fp.clear()

    def maybe_recycle(self):
        """After a sequence caching window: drop every connection (and the ids it cached)."""
        g = self.s.conn_generation
        if g != self.generation:
            self.close_all()
            self.generation = g
            self.s.recycled[self.i] = (g, mono())

    # --- what to write

    def uid(self) -> str:
        self.n += 1
        return f"{self.i}.{self.n}"

    def key(self) -> str:
        r = self.rng.random()
        if r < 0.70:
            return self.rng.choice(HOT_KEYS)
        if r < 0.85:
            return f"w{self.rng.randrange(100)}"
        if r < 0.95:
            n = self.rng.randrange(1, 40)
            return "f-" + "".join(self.rng.choice(string.ascii_lowercase) for _ in range(n))
        r = self.rng.random()
        if r < 0.5 and self.s.long_keys:
            return self.rng.choice(self.s.long_keys)
        if r < 0.7:
            return self.rng.choice(POISON_KEYS)
        n = self.rng.randrange(1, 2001)
        return "".join(self.rng.choice(string.ascii_letters + string.digits) for _ in range(n))

    def topic(self) -> str:
        if self.s.late is not None:
            name = self.s.late.pick(self.rng)
            if name is not None:
                return name
        return self.rng.choice(TOPICS)

    def headers(self, uid) -> dict:
        return {"trace": uid, "fuzz": "1"} if self.rng.random() < 0.2 else {}

    def hold(self, top=1.5) -> float:
        r = self.rng.random()
        if r < 0.3:
            return 0.0
        if r < 0.6:
            return self.rng.uniform(0, 0.2)
        return self.rng.uniform(0, top)

    def payload(self, uid) -> dict:
        p = {"uid": uid, "b": self.behaviour}
        r = self.rng.random()
        if self.large or r < LARGE_SHARE:
            # 100-600 kB that does not compress: with the relays' 1 MiB window (harness.py), a claim
            # with a few of these is cut by bytes (schema 12) and bounds its lanes at the cut.
            p["pad"] = base64.b64encode(self.rng.randbytes(self.rng.randrange(75_000, 450_000))).decode()
        elif r < 0.1:
            p["pad"] = "x" * self.rng.randrange(2000)
        return p

    # --- ledger

    def begin(self, db="main", kind="write"):
        t = self.ledger.begin(self.behaviour, self.i, db=db, kind=kind, epoch=self.epoch)
        self.open.append(t)
        return t

    def end(self, t, outcome):
        self.ledger.end(t, outcome)

    def new_row(self, t, key=None, uid=None, topic=None, headers=None):
        uid = uid or self.uid()
        key = self.key() if key is None else key
        topic = self.topic() if topic is None else topic
        headers = self.headers(uid) if headers is None else headers
        return self.ledger.row(t, uid, key, topic, headers)

    def params(self, r):
        return (r.topic, r.key, Jsonb(self.payload(r.uid)), Jsonb(r.headers))

    def insert(self, c, t, key=None):
        r = self.new_row(t, key)
        r.id = c.execute(INSERT_ONE, self.params(r)).fetchone()[0]
        return r

    def readback(self, rows, c=None):
        """Ids of rows whose writer could not see them (COPY, INSERT ... SELECT, a trigger), by uid,
        after the commit (inside the gate: no TRUNCATE in between)."""
        rows = [r for r in rows if r.id is None]
        if not rows:
            return
        c = c or self.conn()
        by_uid = {r.uid: r for r in rows}
        for uid, event_id in c.execute("SELECT payload->>'uid', id FROM outbox_events WHERE payload->>'uid' = ANY(%s)",
                                       (list(by_uid),)).fetchall():
            by_uid[uid].id = event_id

    def sleep(self, seconds):
        if seconds > 0:
            time.sleep(seconds)


# ---------------------------------------------------------------------------------------------
# Behaviours. Each takes the thread's Ctx; every random choice comes from ctx.rng.


def b_insert_autocommit(ctx: Ctx):
    c = ctx.conn()
    t = ctx.begin()
    ctx.insert(c, t)
    ctx.end(t, "committed")


def _multirow(ctx, c, t, n, key=None):
    rows = [ctx.new_row(t, key) for _ in range(n)]
    values = ", ".join(["(%s, %s, %s, %s)"] * n)
    params = [p for r in rows for p in ctx.params(r)]
    got = c.execute(f"INSERT INTO outbox_events (topic, aggregate_id, payload, headers) VALUES {values} "
                    "RETURNING id, payload->>'uid'", params).fetchall()
    by_uid = {r.uid: r for r in rows}
    for event_id, uid in got:
        by_uid[uid].id = event_id
    return rows


def b_insert_multirow(ctx: Ctx):
    n = ctx.rng.randrange(2, 12)
    same = ctx.key() if ctx.rng.random() < 0.5 else None
    # A bulk of large events (a poll finds them together): its claim is cut by bytes.
    ctx.large = ctx.rng.random() < 0.25
    try:
        _insert_multirow(ctx, n, same)
    finally:
        ctx.large = False


def _insert_multirow(ctx: Ctx, n: int, same):
    if ctx.rng.random() < 0.5:
        c = ctx.conn()
        t = ctx.begin()
        _multirow(ctx, c, t, n, same)
        ctx.end(t, "committed")
    else:
        c = ctx.conn("tx", autocommit=False)
        t = ctx.begin()
        _multirow(ctx, c, t, n, same)
        if ctx.rng.random() < 0.5:
            _multirow(ctx, c, t, ctx.rng.randrange(1, 4))
        ctx.sleep(ctx.hold())
        c.commit()
        ctx.end(t, "committed")


def b_insert_select(ctx: Ctx):
    n = ctx.rng.randrange(1, 60)
    keys = [ctx.key() for _ in range(ctx.rng.randrange(1, 4))]
    prefix = ctx.uid() + "."
    explicit = ctx.rng.random() < 0.4
    c = ctx.conn("tx", autocommit=False) if explicit else ctx.conn()
    t = ctx.begin()
    topic = ctx.topic()
    rows = []
    for g in range(1, n + 1):
        r = ctx.ledger.row(t, f"{prefix}{g}", keys[g % len(keys)], topic, {})
        rows.append(r)
    c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
              "SELECT %s, (%s::text[])[1 + (g %% %s)], jsonb_build_object('uid', %s || g, 'b', 'insert_select') "
              "FROM generate_series(1, %s) AS g", (topic, keys, len(keys), prefix, n))
    if explicit:
        ctx.sleep(ctx.hold())
        c.commit()
    ctx.end(t, "committed")
    ctx.readback(rows)


def b_copy(ctx: Ctx):
    n = ctx.rng.randrange(1, 40)
    explicit = ctx.rng.random() < 0.4
    c = ctx.conn("tx", autocommit=False) if explicit else ctx.conn()
    t = ctx.begin()
    rows = [ctx.new_row(t) for _ in range(n)]
    with c.cursor() as cur:
        with cur.copy("COPY outbox_events (topic, aggregate_id, payload, headers) FROM STDIN") as cp:
            for r in rows:
                cp.write_row((r.topic, r.key, json.dumps(ctx.payload(r.uid)), json.dumps(r.headers)))
    if explicit:
        ctx.sleep(ctx.hold())
        c.commit()
    ctx.end(t, "committed")
    ctx.readback(rows)


def b_publish_fn(ctx: Ctx):
    q = "SELECT outbox_publish(%s, %s, %s, %s)"
    if ctx.rng.random() < 0.5:
        c = ctx.conn()
        t = ctx.begin()
        r = ctx.new_row(t)
        r.id = c.execute(q, ctx.params(r)).fetchone()[0]
        ctx.end(t, "committed")
    else:
        c = ctx.conn("tx", autocommit=False)
        t = ctx.begin()
        for _ in range(ctx.rng.randrange(1, 4)):
            r = ctx.new_row(t)
            r.id = c.execute(q, ctx.params(r)).fetchone()[0]
            ctx.sleep(ctx.hold(0.3))
        c.commit()
        ctx.end(t, "committed")


def b_tx_savepoint(ctx: Ctx):
    c = ctx.conn("tx", autocommit=False)
    t = ctx.begin()
    key = ctx.key()
    for _ in range(ctx.rng.randrange(0, 3)):
        ctx.insert(c, t, key if ctx.rng.random() < 0.5 else None)
    depth = ctx.rng.randrange(1, 3)
    for level in range(depth):
        c.execute(f"SAVEPOINT s{level}")
        inside = [ctx.insert(c, t, key if ctx.rng.random() < 0.5 else None) for _ in range(ctx.rng.randrange(1, 4))]
        if ctx.rng.random() < 0.65:
            c.execute(f"ROLLBACK TO SAVEPOINT s{level}")
            for r in inside:
                r.intent = "rollback"
        else:
            c.execute(f"RELEASE SAVEPOINT s{level}")
        ctx.sleep(ctx.hold(0.5))
    for _ in range(ctx.rng.randrange(0, 3)):
        ctx.insert(c, t, key if ctx.rng.random() < 0.5 else None)
    ctx.sleep(ctx.hold())
    c.commit()
    ctx.end(t, "committed")


def b_tx_rollback(ctx: Ctx):
    c = ctx.conn("tx", autocommit=False)
    t = ctx.begin()
    for _ in range(ctx.rng.randrange(1, 5)):
        ctx.insert(c, t)
    ctx.sleep(ctx.hold())
    c.rollback()
    ctx.end(t, "rolled_back")


def b_tx_hold(ctx: Ctx):
    c = ctx.conn("tx", autocommit=False)
    t = ctx.begin()
    key = ctx.key()
    ctx.insert(c, t, key)
    h = ctx.hold()
    if ctx.rng.random() < 0.5:
        ctx.sleep(h)                                   # idle in transaction
    else:
        c.execute("SELECT pg_sleep(%s)", (h,))         # active, in a statement after its INSERT
    for _ in range(ctx.rng.randrange(0, 3)):
        ctx.insert(c, t, key if ctx.rng.random() < 0.5 else None)
    c.commit()
    ctx.end(t, "committed")


def b_slow_insert(ctx: Ctx):
    """An INSERT whose payload's subquery sleeps after the id was drawn, before the lane mark."""
    explicit = ctx.rng.random() < 0.4
    c = ctx.conn("tx", autocommit=False) if explicit else ctx.conn()
    t = ctx.begin()
    r = ctx.new_row(t)
    r.id = c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload, headers) VALUES "
                     "(%s, %s, (SELECT %s::jsonb FROM pg_sleep(%s)), %s) RETURNING id",
                     (r.topic, r.key, Jsonb(ctx.payload(r.uid)), ctx.hold(1.0), Jsonb(r.headers))).fetchone()[0]
    if explicit:
        if ctx.rng.random() < 0.5:
            ctx.insert(c, t)
        ctx.sleep(ctx.hold(0.5))
        c.commit()
    ctx.end(t, "committed")


def b_multi_statement(ctx: Ctx):
    """INSERT; SELECT pg_sleep(h); INSERT as one simple-query message (one implicit transaction)."""
    c = ctx.conn()
    t = ctx.begin()
    parts, rows = [], []
    for step in range(ctx.rng.randrange(2, 5)):
        if step and ctx.rng.random() < 0.5:
            parts.append(sql.SQL("SELECT pg_sleep({})").format(sql.Literal(ctx.hold(0.8))))
        r = ctx.new_row(t)
        rows.append(r)
        parts.append(sql.SQL("INSERT INTO outbox_events (topic, aggregate_id, payload, headers) VALUES ({}, {}, {}, {})")
                     .format(sql.Literal(r.topic), sql.Literal(r.key), sql.Literal(json.dumps(ctx.payload(r.uid))),
                             sql.Literal(json.dumps(r.headers))))
    c.execute(sql.SQL("; ").join(parts))
    ctx.end(t, "committed")
    ctx.readback(rows)


def b_procedure(ctx: Ctx):
    """CALL of a procedure that COMMITs (and ROLLBACKs) inside, in autocommit."""
    c = ctx.conn()
    call_start = mono()
    plan, keys, uids = [], [], []
    segments = []          # (txn, outcome)
    t = ctx.begin()
    key = ctx.key()
    for _ in range(ctx.rng.randrange(2, 7)):
        step = ctx.rng.choice(["insert", "insert", "insert", "commit", "rollback", "sleep"])
        if step == "insert":
            r = ctx.new_row(t, key if ctx.rng.random() < 0.5 else None, topic="fuzz.proc", headers={})
            plan.append("insert")
            keys.append(r.key)
            uids.append(r.uid)
        else:
            plan.append(step)
            keys.append(None)
            uids.append(None)
            if step in ("commit", "rollback"):
                segments.append((t, "committed" if step == "commit" else "rolled_back"))
                t = ctx.begin()
                t.start = call_start
    segments.append((t, "committed"))
    c.execute("CALL fuzz_proc(%s::text[], %s::text[], %s::text[], %s)", (plan, keys, uids, ctx.hold(0.8)))
    now = mono()
    rows = []
    for txn, outcome in segments:
        ctx.ledger.end(txn, outcome, when=now)
        rows += txn.rows if outcome == "committed" else []
    ctx.readback(rows)


def finish_prepared(ctx: Ctx, gid, commit, db="main", budget=60.0):
    """COMMIT / ROLLBACK PREPARED, again through a fresh connection until it is done (a Postgres
    restart keeps the prepared transaction). Returns True once it is gone."""
    deadline = mono() + budget
    while mono() < deadline:
        try:
            c = ctx.conn("prep", db=db)
            c.execute(f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}'")
            return True
        except psycopg.errors.UndefinedObject:
            return True   # already finished by an attempt whose answer was lost
        except psycopg.Error:
            ctx.close_all()
            time.sleep(0.3)
    return False


def _prepared(ctx: Ctx, db):
    if not ctx.s.prepared_slots.acquire(timeout=5):
        return
    try:
        c = ctx.conn("prep", db=db)
        gid = f"fz-{db}-{ctx.uid()}"
        t = ctx.begin(db=db)
        t.gid = gid
        commit = ctx.rng.random() < 0.7
        state = "open"
        try:
            c.execute("BEGIN")
            key = ctx.key()
            for _ in range(ctx.rng.randrange(1, 4)):
                ctx.insert(c, t, key if ctx.rng.random() < 0.6 else None)
            state = "preparing"
            c.execute(f"PREPARE TRANSACTION '{gid}'")
            t.prepared_at = time.monotonic()
            state = "prepared"
            # Held past the latency budget now and then: a relay that let a prepared transaction hold
            # every lane shows only when it holds an event of another lane for longer than 2 s.
            ctx.sleep(_long_hold(ctx))
        finally:
            if state == "open":
                pass       # nothing prepared: the error path ends t as unknown (the table decides)
            else:
                if state == "preparing":
                    ctx.close_all()
                    try:
                        c2 = ctx.conn("prep", db=db)
                        there = c2.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s",
                                           (gid,)).fetchone()[0]
                    except psycopg.Error:
                        there = 1   # cannot tell yet: finish_prepared tries (an absent gid is fine)
                    if not there:
                        ctx.end(t, "rolled_back")
                if t.end is None:
                    if finish_prepared(ctx, gid, commit, db):
                        ctx.end(t, "committed" if commit else "rolled_back")
                    else:
                        ctx.end(t, "unknown")
    finally:
        ctx.s.prepared_slots.release()


def b_prepared(ctx: Ctx):
    _prepared(ctx, "main")


def b_pipeline(ctx: Ctx):
    explicit = ctx.rng.random() < 0.4
    c = ctx.conn("tx", autocommit=False) if explicit else ctx.conn()
    t = ctx.begin()
    key = ctx.key()
    rows, curs = [], []
    with c.pipeline():
        for _ in range(ctx.rng.randrange(2, 8)):
            r = ctx.new_row(t, key if ctx.rng.random() < 0.5 else None)
            rows.append(r)
            curs.append(c.execute(INSERT_ONE, ctx.params(r)))
        if explicit:
            c.commit()
    for r, cur in zip(rows, curs):
        r.id = cur.fetchone()[0]
    ctx.end(t, "committed")


def _fastpath(ctx: Ctx, db):
    fp = ctx.fastpath(db)
    explicit = ctx.rng.random() < 0.4
    t = ctx.begin(db=db)
    if explicit:
        fp.exec("BEGIN")
    key = ctx.key()
    for _ in range(ctx.rng.randrange(1, 3) if explicit else 1):
        r = ctx.new_row(t, key if ctx.rng.random() < 0.6 else None, topic="fuzz.fastpath", headers={})
        sleep = 0.0 if ctx.rng.random() < 0.5 else (_long_hold(ctx) if db == "copy" else ctx.hold(1.0))
        fp.exec("SELECT set_config('fuzz.key', '%s', false), set_config('fuzz.uid', '%s', false), "
                "set_config('fuzz.sleep', '%s', false)" % (r.key.replace("'", "''"), r.uid, sleep))
        r.id = fp.call_int(ctx.s.fnid[db])
    if explicit:
        ctx.sleep(ctx.hold(0.5))
        commit = ctx.rng.random() < 0.8
        fp.exec("COMMIT" if commit else "ROLLBACK")
        ctx.end(t, "committed" if commit else "rolled_back")
    else:
        ctx.end(t, "committed")


def b_fastpath(ctx: Ctx):
    _fastpath(ctx, "main")


def _lock(ctx, c, t, event_id, uid, how):
    t.lock_uid = uid
    t.lock_start = mono()
    if how == "receipt":
        c.execute("INSERT INTO receipts (event_id) VALUES (%s)", (event_id,))    # FOR KEY SHARE
    else:
        c.execute("SELECT id FROM outbox_events WHERE id = %s FOR SHARE", (event_id,)).fetchall()


def b_lock_pending(ctx: Ctx):
    """Share-locks a pending row (a receipt's foreign key check, or FOR SHARE) and holds the lock."""
    ac = ctx.conn()
    found = ac.execute("SELECT id, payload->>'uid' FROM outbox_events WHERE processed_at IS NULL "
                       "AND dead_lettered_at IS NULL AND payload ? 'uid' ORDER BY id DESC LIMIT 1").fetchall()
    if not found or found[0][1] not in ctx.ledger.rows:
        return
    event_id, uid = found[0]
    c = ctx.conn("lock", autocommit=False)
    t = ctx.begin(kind="lock")
    _lock(ctx, c, t, event_id, uid, ctx.rng.choice(["receipt", "share"]))
    ctx.sleep(ctx.hold())
    if ctx.rng.random() < 0.5:
        c.commit()
    else:
        c.rollback()
    ctx.end(t, "committed")


def b_lock_held(ctx: Ctx):
    """K:1 open in a transaction (its lane held), K:2 committed behind it, K:2 share-locked, K:1
    ends, K:3 committed: K:3 must not overtake the locked K:2, which goes out when the lock goes."""
    key = ctx.key()
    tx = ctx.conn("tx", autocommit=False)
    ac = ctx.conn()
    lk = ctx.conn("lock", autocommit=False)
    t1 = ctx.begin()
    ctx.insert(tx, t1, key)
    t2 = ctx.begin()
    e2 = ctx.insert(ac, t2, key)
    ctx.end(t2, "committed")
    tl = ctx.begin(kind="lock")
    _lock(ctx, lk, tl, e2.id, e2.uid, ctx.rng.choice(["receipt", "share"]))
    ctx.sleep(ctx.rng.uniform(0, 0.3))
    if ctx.rng.random() < 0.7:
        tx.commit()
        ctx.end(t1, "committed")
    else:
        tx.rollback()
        ctx.end(t1, "rolled_back")
    t3 = ctx.begin()
    ctx.insert(ac, t3, key)
    ctx.end(t3, "committed")
    ctx.sleep(ctx.hold())
    lk.commit() if ctx.rng.random() < 0.5 else lk.rollback()
    ctx.end(tl, "committed")


def b_trigger(ctx: Ctx):
    """INSERT INTO orders: an AFTER INSERT trigger writes the events."""
    c = ctx.conn("tx", autocommit=False)
    t = ctx.begin()
    rows = [ctx.ledger.row(t, ctx.uid(), ctx.key(), "order.placed", {}) for _ in range(ctx.rng.randrange(1, 6))]
    if ctx.rng.random() < 0.5:
        for r in rows:
            c.execute("INSERT INTO orders (key, uid, amount) VALUES (%s, %s, %s)", (r.key, r.uid, ctx.rng.randrange(1000)))
    else:
        values = ", ".join(["(%s, %s, 1)"] * len(rows))
        c.execute(f"INSERT INTO orders (key, uid, amount) VALUES {values}", [p for r in rows for p in (r.key, r.uid)])
    ctx.sleep(ctx.hold())
    if ctx.rng.random() < 0.8:
        c.commit()
        ctx.end(t, "committed")
        ctx.readback(rows)
    else:
        c.rollback()
        ctx.end(t, "rolled_back")


def _long_hold(ctx):
    """The other database's holds: longer than the latency budget now and then, so that a relay
    that waits for such a transaction shows late events (a wait shorter than the budget cannot be
    told from a slow poll). Nothing in the relays' database waits for them."""
    return ctx.rng.uniform(2.0, 4.0) if ctx.rng.random() < 0.3 else ctx.hold()


def b_other_db(ctx: Ctx):
    """Writers in the database cloned from the relays' one (same table OID); no relay serves it."""
    kind = ctx.rng.choice(["tx", "tx", "prepared", "slow", "fastpath"])
    if kind == "prepared":
        _prepared(ctx, "copy")
        return
    if kind == "fastpath":
        _fastpath(ctx, "copy")
        return
    c = ctx.conn("tx", db="copy", autocommit=False)
    t = ctx.begin(db="copy")
    if kind == "slow":
        r = ctx.new_row(t)
        c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload, headers) VALUES "
                  "(%s, %s, (SELECT %s::jsonb FROM pg_sleep(%s)), %s)",
                  (r.topic, r.key, Jsonb(ctx.payload(r.uid)), _long_hold(ctx), Jsonb(r.headers)))
    else:
        for _ in range(ctx.rng.randrange(1, 4)):
            ctx.insert(c, t)
    ctx.sleep(_long_hold(ctx))
    if ctx.rng.random() < 0.6:
        c.commit()
        ctx.end(t, "committed")
    else:
        c.rollback()
        ctx.end(t, "rolled_back")


def _admin_due(ctx, name, cooldown):
    last = ctx.s.last_admin.get(name)
    return last is None or mono() - last >= cooldown


def b_seq_cache(ctx: Ctx):
    """ALTER SEQUENCE ... CACHE k while writers run, back to CACHE 1 after a while; then every writer
    drops its connections (the blocks they cached). The window lasts until they all have."""
    if not _admin_due(ctx, "seq_cache", 25) or not ctx.s.admin.acquire(blocking=False):
        return "skipped"
    try:
        ctx.s.last_admin["seq_cache"] = mono()
        k = ctx.rng.randrange(2, 30)
        hold = ctx.rng.uniform(1.0, 3.0)
        w = ctx.ledger.window("seq_cache", f"CACHE {k} for {hold:.1f} s")
        c = ctx.conn("admin")
        t = ctx.begin(kind="admin")
        try:
            c.execute(f"ALTER SEQUENCE {SEQ} CACHE {k}")
            ctx.end(t, "committed")
            # The other writers use their connections meanwhile (each caches a block); this thread
            # draws from its own block too, through a second connection.
            deadline = mono() + hold
            while mono() < deadline and not ctx.s.stop.is_set():
                t2 = ctx.begin()
                ctx.insert(ctx.conn("cached"), t2)
                ctx.end(t2, "committed")
                ctx.sleep(ctx.rng.uniform(0.05, 0.3))
        finally:
            # Back to CACHE 1 with no behaviour in flight (the gate alone), and every connection
            # marked old before any writer draws again: no id from a cached block comes after it.
            got = ctx.s.gate.acquire_exclusive(timeout=30)
            try:
                t3 = ctx.begin(kind="admin")
                for attempt in range(100):
                    try:
                        ctx.conn("admin").execute(f"ALTER SEQUENCE {SEQ} CACHE 1")
                        break
                    except psycopg.Error:
                        ctx.close_all()
                        time.sleep(0.3)
                ctx.end(t3, "committed")
                w.end = mono()
                ctx.s.conn_generation += 1
                gen = ctx.s.conn_generation
            finally:
                if got:
                    ctx.s.gate.release_exclusive()
            ctx.maybe_recycle()
            # Every writer thread drops its connections at its next behaviour.
            limit = mono() + 15
            while mono() < limit and not ctx.s.stop.is_set():
                if all(ctx.s.recycled.get(i, (0, 0))[0] >= gen for i in range(ctx.s.threads)):
                    break
                time.sleep(0.05)
            done = [ctx.s.recycled.get(i, (0, mono()))[1] for i in range(ctx.s.threads)]
            w.release_at = max([w.end] + done)
            w.info += f"; every writer reconnected {w.release_at - w.end:.2f} s after CACHE 1"
    finally:
        ctx.s.admin.release()


def b_truncate(ctx: Ctx):
    """TRUNCATE outbox_events RESTART IDENTITY while writers run (between their transactions): a new
    epoch, whose ids start at 1 again."""
    # Called without the gate held (see Writer.run): it takes the gate alone.
    if not _admin_due(ctx, "truncate", 30) or not ctx.s.admin.acquire(blocking=False):
        return "skipped"
    try:
        ctx.s.last_admin["truncate"] = mono()
        if not ctx.s.gate.acquire_exclusive(timeout=20):
            return "skipped"
        try:
            start = mono()
            t = ctx.ledger.begin("truncate", ctx.i, kind="admin")
            ctx.open.append(t)
            done = False
            try:
                c = ctx.conn("admin")
                c.execute("BEGIN")
                # The dead letters the TRUNCATE removes: read under its lock, so that none is made
                # in between (the checker needs every one; the fuzzer reads the rest every check).
                c.execute("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE")
                dead = c.execute("SELECT payload->>'uid', last_error FROM outbox_events "
                                 "WHERE dead_lettered_at IS NOT NULL").fetchall()
                c.execute("TRUNCATE outbox_events, receipts RESTART IDENTITY")
                c.execute("COMMIT")
                done = True
                with ctx.ledger.lock:
                    for uid, why in dead:
                        ctx.s.dead_letters.setdefault(uid, why)
            except psycopg.Error:
                # Did it commit? No writer runs (the gate) and relays insert nothing: an empty table
                # says it did.
                ctx.close_all()
                for _ in range(100):
                    try:
                        done = ctx.conn("admin").execute("SELECT NOT EXISTS (SELECT FROM outbox_events)").fetchone()[0]
                        break
                    except psycopg.Error:
                        ctx.close_all()
                        time.sleep(0.3)
            end = mono()
            ctx.ledger.end(t, "committed" if done else "rolled_back", when=end)
            if done:
                with ctx.ledger.lock:
                    ctx.ledger.truncates.append(Truncate(start, end, ctx.ledger.epoch))
                    ctx.ledger.epoch += 1
            else:
                return "skipped"
        finally:
            ctx.s.gate.release_exclusive()
    finally:
        ctx.s.admin.release()


# name -> (weight, function, holds the gate while it runs)
BEHAVIOURS = {
    "insert_autocommit": (10, b_insert_autocommit),
    "insert_multirow": (6, b_insert_multirow),
    "insert_select": (4, b_insert_select),
    "copy": (4, b_copy),
    "publish_fn": (5, b_publish_fn),
    "tx_savepoint": (5, b_tx_savepoint),
    "tx_rollback": (4, b_tx_rollback),
    "tx_hold": (6, b_tx_hold),
    "slow_insert": (3, b_slow_insert),
    "multi_statement": (3, b_multi_statement),
    "procedure": (3, b_procedure),
    "prepared": (4, b_prepared),
    "pipeline": (4, b_pipeline),
    "fastpath": (4, b_fastpath),
    "lock_pending": (3, b_lock_pending),
    "lock_held": (2, b_lock_held),
    "trigger": (4, b_trigger),
    "other_db": (4, b_other_db),
    "seq_cache": (1, b_seq_cache),
    "truncate": (1, b_truncate),
}
NO_GATE = {"truncate", "seq_cache"}


class Writer:
    """One writer thread: picks behaviours from its own random.Random until told to stop."""

    def __init__(self, shared: Shared, index: int, seed: int, enabled: dict, max_behaviours=100000):
        self.s = shared
        self.ctx = Ctx(shared, index, random.Random(seed))
        self.enabled = enabled
        self.names = list(enabled)
        self.weights = [enabled[n][0] for n in self.names]
        self.max_behaviours = max_behaviours
        self.thread = threading.Thread(target=self.run, name=f"writer-{index}", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def run(self):
        ctx, ledger = self.ctx, self.s.ledger
        for _ in range(self.max_behaviours):
            if self.s.stop.is_set():
                break
            name = ctx.rng.choices(self.names, self.weights)[0]
            fn = self.enabled[name][1]
            pause = ctx.rng.uniform(0, 0.12)
            ctx.behaviour = name
            gated = name not in NO_GATE
            if gated and not self.s.gate.acquire_shared(timeout=30):
                continue
            ctx.maybe_recycle()     # inside the gate: after a CACHE 1, before drawing any id
            try:
                ctx.epoch = ledger.epoch
                if fn(ctx) != "skipped":
                    ledger.ran(name)
            except Exception as e:  # noqa: BLE001 - any error: the table decides what committed
                ledger.error(name, e)
                if not isinstance(e, (psycopg.Error, ConnectionError, OSError)):
                    # Not the database's doing: a bug of the fuzzer itself, reported as a failure.
                    import traceback
                    with ledger.lock:
                        ledger.fuzzer_errors.append((mono(), name, traceback.format_exc()))
                for t in ctx.open:
                    if t.end is None:
                        ledger.end(t, "unknown")
                ctx.close_all()
                time.sleep(0.2 + ctx.rng.uniform(0, 0.3))
            finally:
                ctx.open.clear()
                if gated:
                    self.s.gate.release_shared()
            if pause:
                time.sleep(pause)
        ctx.close_all()
        self.s.recycled[ctx.i] = (10 ** 9, mono())
