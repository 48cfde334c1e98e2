#!/usr/bin/env python3
"""A fuzzer for outbox-relay's per-key ordering promise.

    ~/.cache/outbox-relay/venv/bin/python tests/fuzz/fuzz.py --seconds 100 --seed N \
        --relay-bin PATH [--relays 1-3] [--without NAME ...]

Starts a throwaway PostgreSQL 15 cluster (scripts/pg-cluster.sh, PG_FAST=1), migrates a database
with the relay under test, clones it (CREATE DATABASE ... TEMPLATE) for writers no relay serves,
starts 1-3 relays with a file sink or a webhook each (sweep_interval 1h: a wait for the sweep is a
failure; the webhook receiver fails some attempts),
then runs writer threads that pick behaviours (writers.py) from one random.Random(seed), while a
chaos thread kills, stops and restarts relays and restarts Postgres. A tailer reads the sink files
as they grow; the checker (checker.py) runs every few seconds on the partial history and once at
the end, after a grace period. The last line is `fuzz: N passed, 0 failed` or
`fuzz: 0 passed, 1 failed`; the exit status 0 or 1."""
from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from checker import check  # noqa: E402
from harness import (Cluster, KafkaBroker, KafkaReader, Receiver, RelaySlot, Tailer, make_workdir, mono,  # noqa: E402
                     remove_workdir, run_cli)
from ledger import INF, Ledger  # noqa: E402
from writers import BEHAVIOURS, SETUP_SQL, TOPICS, LateTopics, Shared, Writer  # noqa: E402

CHAOS = {"relay_kill": 4, "relay_stop": 4, "pg_restart": 2, "relay_reload": 2, "kafka_restart": 2}
SINK_CHAOS = {"kafka_restart": ("kafka", "kafka-eos")}  # chaos that needs one of those sink modes
SINK_MODES = {"webhook": 5, "mixed": 4, "file": 1}      # name -> weight when picked from the seed
EVENTS_PER_REQUEST = (1, 1, 4, 50)                      # a webhook relay's events_per_request, drawn
OTHER_SINK_MODES = ["kafka", "kafka-eos"]
# The share of seeds that pick a kafka mode when --sinks is not given: a draw of its own
# (random.Random of "<seed>:kafka"), so a seed that does not pick it picks the same mode as before
# kafka mode existed; half of them kafka-eos. The broker's start then counts against --seconds
# (CI's 80 s stay 80 s: ~15 s of it go to the broker and the takeovers).
KAFKA_SEED_SHARE = 0.2
# --sinks kafka: the sink's topic template, the row topics whose Kafka topics exist from the start
# (every topic a writer uses but the late ones), and the batch deadline (delivery_timeout; the
# producer's topic.metadata.propagation.max.ms is half of it: a record for a missing topic fails
# after that).
KAFKA_TEMPLATE = "fuzz.{topic}"
KAFKA_TOPICS = TOPICS + ["fuzz.proc", "fuzz.fastpath"]
KAFKA_PARTITIONS = 3
KAFKA_DELIVERY_TIMEOUT = 1.5
# kafka-eos: the sink's progress topic (the default <transactional_id>.progress of sink "kafka"),
# created beforehand as docs/sinks.md asks (64 partitions, compacted).
KAFKA_PROGRESS_TOPIC = "outbox-relay.kafka.progress"
# After a late topic is ready, the relay's next attempt at an event for it comes within the failing
# attempt's end (at most the batch deadline) plus the retry's backoff (at most 2 s).
KAFKA_LATE_ALLOWANCE = KAFKA_DELIVERY_TIMEOUT + 2.0
# A record for a missing topic may get no report at all before the batch deadline (librdkafka 2.0.2
# here: the first record for a topic a producer has not seen), so the batch waits for it, the
# producer is replaced and a new one takes about 1 s for its first batch: every event in the sink
# meanwhile waits too. So a late topic is also a disruption window for every event, from a
# writer's first use to its readiness plus the batch deadline, released KAFKA_NEW_PRODUCER later
# (found by seed 4: events of other keys 0.8 s late around a replaced producer).
KAFKA_NEW_PRODUCER = 1.5
# After a broker restart (SIGKILL, 0.1-2 s down, started again, every topic led again): the batch
# deadline replaces the producer, the retry's backoff, a new producer's connection.
KAFKA_RESTART_ALLOWANCE = KAFKA_DELIVERY_TIMEOUT + 2.0 + 1.0
# kafka-eos: a transaction open when the broker died holds read_committed readers until the
# coordinator aborts it (the sink's transaction_timeout, 10 s here) or a takeover fences it.
# (Seed 8's first kafka-eos run: events 2.3 s past the 4.5 s allowance after a broker restart.)
KAFKA_EOS_RESTART_ALLOWANCE = 10.0 + KAFKA_RESTART_ALLOWANCE
# kafka-eos: the log line of a relay that took the lanes over (the one that publishes).
EOS_TAKEOVER = "kafka takeover: producer initialised"
MAIN_DB, COPY_DB = "fuzz_main", "fuzz_copy"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=100.0, help="how long writers run (default 100)")
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a fresh one)")
    p.add_argument("--relay-bin", default=os.environ.get("OUTBOX_RELAY_BIN", "/tmp/relay-new/outbox-relay"))
    p.add_argument("--relays", default="1-3", help="relay count, N or A-B (picked from the seed)")
    p.add_argument("--writers", type=int, default=5, help="writer threads (default 5, at most 6)")
    p.add_argument("--sinks", choices=list(SINK_MODES) + OTHER_SINK_MODES, default=None,
                   help="file: every relay a file sink; webhook: every relay a webhook whose receiver fails "
                        "some attempts; mixed: each relay either (default: picked from the seed among these); "
                        "kafka: one real Kafka broker, every relay a kafka sink spreading a key's events over "
                        "several topics, some of which are created late (tests/fuzz/README.md); kafka-eos: "
                        "the same with exactly_once, a read_committed reader, no late topic, no duplicate")
    p.add_argument("--without", action="append", default=[], metavar="NAME",
                   help="switch a behaviour off (repeatable; also relay_kill, relay_stop, pg_restart)")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated behaviours (and chaos kinds) to run, every other one off")
    p.add_argument("--events-per-request", type=int, default=None, metavar="N",
                   help="every webhook relay's events_per_request (default: drawn from the seed, one of "
                        f"{', '.join(map(str, sorted(set(EVENTS_PER_REQUEST))))})")
    p.add_argument("--latency", type=float, default=2.0, help="delivery budget in seconds (default 2)")
    p.add_argument("--grace", type=float, default=30.0, help="max seconds to let the relays drain at the end")
    p.add_argument("--chaos-every", default="3-10", help="seconds between chaos events, A-B (default 3-10)")
    p.add_argument("--check-every", type=float, default=5.0, help="seconds between partial checks")
    p.add_argument("--stop-on-failure", action="store_true", help="end the run at the first violation")
    p.add_argument("--keep", action="store_true", help="keep the work directory (always kept on failure)")
    p.add_argument("--details", type=int, default=6, help="violations shown with their history")
    p.add_argument("--list", action="store_true", help="list the behaviours and exit")
    args = p.parse_args(argv)
    known = set(BEHAVIOURS) | set(CHAOS)
    if args.only:
        only = [x.strip() for x in args.only.split(",") if x.strip()]
        for name in only:
            if name not in known:
                p.error(f"--only {name}: no such behaviour (known: {', '.join(sorted(known))})")
        args.without = sorted(set(args.without) | (known - set(only)))
    if not set(BEHAVIOURS) - set(args.without):
        p.error("every writer behaviour is switched off")
    for name in args.without:
        if name not in known:
            p.error(f"--without {name}: no such behaviour (known: {', '.join(sorted(known))})")
    if not 1 <= args.writers <= 6:
        p.error("--writers: 1 to 6")
    return args


def pick_range(text, rng):
    if "-" in text:
        a, b = (int(x) for x in text.split("-", 1))
        return rng.randint(a, b)
    return int(text)


class Chaos:
    """Kills (SIGKILL) and restarts relays, stops them (SIGSTOP) for 0.5-3 s, restarts Postgres,
    reloads a relay's config (SIGHUP) with another batch_size (and, for a webhook relay, an
    events_per_request drawn again: a changed sink is rebuilt between two batches)."""

    def __init__(self, fz, rng, enabled, every):
        self.fz, self.rng, self.enabled = fz, rng, enabled
        self.every = tuple(float(x) for x in every.split("-", 1)) if "-" in every else (float(every),) * 2
        self.stop = threading.Event()
        self.counts = {k: 0 for k in enabled}
        self.problems = []      # (kind, text, time)
        self.last_pg = -INF
        self.last_kafka = -INF
        self.thread = threading.Thread(target=self.run, name="chaos", daemon=True)

    def start(self):
        if self.enabled:
            self.thread.start()
        return self

    def run(self):
        names = list(self.enabled)
        weights = [CHAOS[n] for n in names]
        for _ in range(100000):
            if self.stop.wait(self.rng.uniform(*self.every)):
                break
            name = self.rng.choices(names, weights)[0]
            if name == "pg_restart" and mono() - self.last_pg < 30:
                continue
            if name == "kafka_restart" and mono() - self.last_kafka < 30:
                continue
            try:
                getattr(self, name)()
                self.counts[name] += 1
            except Exception as e:  # noqa: BLE001
                self.problems.append(("chaos_error", f"{name}: {e!r}", mono()))
                traceback.print_exc()

    def _slot(self):
        live = [s for s in self.fz.slots if s.alive()]
        return self.rng.choice(live) if live else None

    def _rebalanced(self, slot, after, timeout=30.0):
        deadline = mono() + timeout
        while mono() < deadline:
            t = self.fz.tailer.log_seen(slot.index, slot.generation, "ordering lanes rebalanced", after)
            if t is not None:
                return t
            if not slot.alive():
                return None
            time.sleep(0.05)
        return None

    def _taken_over(self, after, timeout=30.0):
        """kafka-eos: when a live relay took the lanes over (its producer initialised, the mark
        read back) after `after`, or None. One relay owns every lane; the others stand by and log
        no rebalance, so a rebalance is not the sign of a relay at work."""
        deadline = mono() + timeout
        while mono() < deadline:
            seen = [self.fz.tailer.log_seen(s.index, s.generation, EOS_TAKEOVER, after)
                    for s in self.fz.slots if s.alive()]
            seen = [t for t in seen if t is not None]
            if seen:
                return min(seen)
            time.sleep(0.05)
        return None

    def _relay_kill_eos(self, slot, down, w):
        """relay_kill in kafka-eos mode: the window ends when the restarted relay listens and, if
        the killed one owned the lanes, when a relay (any) took them over."""
        last = self.fz.tailer.log_last(EOS_TAKEOVER)
        owned = last is not None and last[1:] == (slot.index, slot.generation)
        killed = mono()
        slot.kill()
        time.sleep(down)
        started = mono()
        slot.start()
        deadline = started + 30
        seen = None
        while seen is None and mono() < deadline and slot.alive():
            seen = self.fz.tailer.log_seen(slot.index, slot.generation, "listening", started)
            time.sleep(0.05)
        if seen is None:
            self.problems.append(("restart_stuck", f"relay{slot.index} (generation {slot.generation}) restarted at "
                                  f"{self.fz.ledger.rel(started)} did not log 'listening' within 30 s", started))
            seen = mono()
        if owned:
            took = self._taken_over(killed)
            if took is None:
                self.problems.append(("takeover_stuck", f"no relay took the lanes over within 30 s of relay"
                                      f"{slot.index}'s kill at {self.fz.ledger.rel(killed)}", killed))
            seen = max(seen, took or mono())
        w.end = seen
        w.release_at = seen + 1.0
        w.info += f"; {'owner' if owned else 'standby'}, back {seen - started:.2f} s after its start"

    def relay_kill(self):
        slot = self._slot()
        if slot is None:
            return
        down = self.rng.uniform(0.1, 2.0)
        w = self.fz.ledger.window("relay_kill", f"relay{slot.index} SIGKILL, down {down:.1f} s")
        if self.fz.sink_mode == "kafka-eos":
            return self._relay_kill_eos(slot, down, w)
        slot.kill()
        time.sleep(down)
        started = mono()
        slot.start()
        seen = self._rebalanced(slot, started)
        if seen is None:
            self.problems.append(("restart_stuck", f"relay{slot.index} (generation {slot.generation}) restarted at "
                                  f"{self.fz.ledger.rel(started)} did not log 'ordering lanes rebalanced' within 30 s",
                                  started))
            seen = mono()
        w.end = seen
        w.release_at = seen + 1.0     # the budget from here: 3 s after the restarted relay rebalanced
        w.info += f"; rebalanced {seen - started:.2f} s after its start"

    def relay_stop(self):
        slot = self._slot()
        if slot is None:
            return
        pause = self.rng.uniform(0.5, 3.0)
        w = self.fz.ledger.window("relay_stop", f"relay{slot.index} SIGSTOP for {pause:.1f} s")
        slot.stop_signal()
        time.sleep(pause)
        slot.cont()
        resumed = mono()
        # Until its first reading after SIGCONT the relay cannot tell a writer that began after the
        # stop from one open at an event's commit, and holds the event for it (found by kafka-eos
        # seed 21: a transaction prepared 30 ms after the SIGCONT, seen by the reading 13 ms after
        # it, held events committed during the stop). A relay that takes no reading (a standby)
        # releases at the SIGCONT.
        seen = None
        while seen is None and mono() < resumed + 1.0 and slot.alive():
            seen = self.fz.tailer.reading_seen(slot.index, slot.generation, resumed)
            time.sleep(0.01)
        w.end = w.release_at = seen or resumed

    def relay_reload(self):
        slot = self._slot()
        if slot is None:
            return
        size = self.rng.choice([50, 100, 250, 500, 1000])
        per_request = None
        if slot.sink == "webhook" and not self.fz.args.events_per_request:
            # A draw of its own (the chaos draws of a seed stay what they were).
            draw = random.Random(f"{self.fz.seed}:reload:{self.counts['relay_reload']}")
            per_request = draw.choice(EVENTS_PER_REQUEST)
        w = self.fz.ledger.window("relay_reload", f"relay{slot.index} SIGHUP, batch_size {size}" + (
            f", events_per_request {per_request}" if per_request else ""))
        started = mono()
        slot.reload(size, per_request)
        deadline = started + 10.0
        seen = None
        while seen is None and mono() < deadline and slot.alive():
            seen = self.fz.tailer.log_seen(slot.index, slot.generation, "config reloaded", started)
            time.sleep(0.05)
        if seen is None and slot.alive():
            self.problems.append(("reload_stuck", f"relay{slot.index} (generation {slot.generation}) did not log "
                                  f"'config reloaded' within 10 s of SIGHUP", started))
        # A reload holds nothing back: no budget beyond the usual one.
        w.end = w.release_at = mono()

    def kafka_restart(self):
        """SIGKILL the broker, 0.1-2 s down, start it again (same port and data); the window ends
        when every topic has a leader again."""
        self.last_kafka = mono()
        broker = self.fz.broker
        down = self.rng.uniform(0.1, 2.0)
        w = self.fz.ledger.window("kafka_restart", f"kafka broker SIGKILL, down {down:.1f} s")
        try:
            broker.kill()
            time.sleep(down)
            broker.restart()
            for topic in self.fz.kafka_topics():
                broker.create_topic(topic, KAFKA_PARTITIONS)      # exists: waits for its leaders
        finally:
            back = mono()
            w.end = back
            w.release_at = back + (KAFKA_EOS_RESTART_ALLOWANCE if self.fz.sink_mode == "kafka-eos"
                                   else KAFKA_RESTART_ALLOWANCE)
            w.info += f"; back (every topic led) after {back - w.start:.2f} s"

    def pg_restart(self):
        self.last_pg = mono()
        w = self.fz.ledger.window("pg_restart", "pg_ctl restart -m fast")
        self.fz.cluster.restart()
        back = mono()
        seen = []
        if self.fz.sink_mode == "kafka-eos":  # every session died: some relay takes the lanes over
            took = self._taken_over(back - 0.5)
            if took is None:
                self.problems.append(("takeover_stuck", "no relay took the lanes over within 30 s of Postgres "
                                      "coming back", back))
            seen.append(took or mono())
        for slot in self.fz.slots if self.fz.sink_mode != "kafka-eos" else []:
            if slot.alive():
                t = self._rebalanced(slot, back - 0.5)
                if t is None and slot.alive():
                    self.problems.append(("reconnect_stuck", f"relay{slot.index} did not log 'ordering lanes "
                                          f"rebalanced' within 30 s of Postgres coming back", back))
                seen.append(t or mono())
        w.end = max([back] + seen)
        w.release_at = w.end + 1.0
        w.info += f"; Postgres back after {back - w.start:.2f} s, relays rebalanced {w.end - back:.2f} s later"


class Fuzz:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2 ** 31)
        self.rng = random.Random(self.seed)
        self.ledger = Ledger()
        self.tailer = Tailer()
        self.slots: list[RelaySlot] = []
        self.cluster = None
        self.workdir = None
        self.writers = []
        self.shared = None
        self.chaos = None
        self.relay_exits = []
        self.first_seen = {}      # violation sig -> (elapsed, violation)
        self.first_kind = {}      # kind -> elapsed
        self._cleaned = False
        self._lanes = {}
        self.receiver = None
        self.per_request = []
        self.dead = {}            # uid -> last_error of the rows dead-lettered so far
        self.broker = None        # --sinks kafka: KafkaBroker, KafkaReader, the late topics
        self.reader = None
        self.late = None
        self.topic_ready = {}     # late row topic -> monotonic time its Kafka topic was ready
        self.late_thread = None
        self.late_windows = {}    # late row topic -> its disruption window (kafka_late_topic)

    # --- setup

    def setup(self):
        a = self.args
        self.nrelays = pick_range(a.relays, self.rng)
        self.sink_mode = a.sinks or self.rng.choices(list(SINK_MODES), list(SINK_MODES.values()))[0]
        self.seconds = a.seconds
        kafka_draw = random.Random(f"{self.seed}:kafka")
        if a.sinks is None and kafka_draw.random() < KAFKA_SEED_SHARE:
            self.sink_mode = "kafka-eos" if kafka_draw.random() < 0.5 else "kafka"
        self.enabled = {k: v for k, v in BEHAVIOURS.items() if k not in a.without}
        self.chaos_enabled = [k for k in CHAOS if k not in a.without and self.sink_mode in SINK_CHAOS.get(
            k, (self.sink_mode,))]
        self.workdir = make_workdir()
        self.cluster = Cluster(self.workdir).start()
        with psycopg.connect(self.cluster.url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {MAIN_DB}")
        self.main_url = self.cluster.url_for(MAIN_DB)
        self.copy_url = self.cluster.url_for(COPY_DB)
        run_cli(a.relay_bin, "migrate", env={"DATABASE_URL": self.main_url})
        with psycopg.connect(self.main_url, autocommit=True) as c:
            for stmt in SETUP_SQL:
                c.execute(stmt)
            fnid = c.execute("SELECT 'fuzz_fp_insert()'::regprocedure::oid").fetchone()[0]
            cache = c.execute("SELECT seqcache FROM pg_sequence WHERE seqrelid = 'outbox_events_id_seq'::regclass"
                              ).fetchone()[0]
        # The clone: before any relay connects (nobody may be connected to the template).
        with psycopg.connect(self.cluster.url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {COPY_DB} TEMPLATE {MAIN_DB}")
        with psycopg.connect(self.copy_url, autocommit=True) as c:
            fnid_copy = c.execute("SELECT 'fuzz_fp_insert()'::regprocedure::oid").fetchone()[0]
        self.tailer.start()
        hooks = {"file": [False] * self.nrelays, "webhook": [True] * self.nrelays, "kafka": [False] * self.nrelays,
                 "kafka-eos": [False] * self.nrelays,
                 "mixed": [i % 2 == 0 for i in range(self.nrelays)]}[self.sink_mode]
        if any(hooks):
            self.receiver = Receiver(self.tailer, self.seed).start()
        # Several events a request for some webhook relays; a draw of its own, so that the other
        # draws of a seed stay what they were.
        per_request_draw = random.Random(f"{self.seed}:events_per_request")
        self.per_request = [(a.events_per_request or per_request_draw.choice(EVENTS_PER_REQUEST)) if hook else None
                            for hook in hooks]
        kafka = None
        if self.sink_mode in ("kafka", "kafka-eos"):
            kafka = self.setup_kafka(eos=self.sink_mode == "kafka-eos")
        for i in range(self.nrelays):
            self.slots.append(RelaySlot(i, a.relay_bin, self.main_url, self.workdir, self.tailer,
                                        self.receiver if hooks[i] else None, kafka,
                                        self.per_request[i] or 1).start())
        # Each relay has rebalanced; with kafka-eos each listens (a standby gains no lane) and one
        # has taken the lanes over.
        ready = "listening" if self.sink_mode == "kafka-eos" else "ordering lanes rebalanced"
        for s in self.slots:
            deadline = mono() + 30
            while mono() < deadline and self.tailer.log_seen(s.index, s.generation, ready) is None:
                if not s.alive():
                    raise RuntimeError(f"relay{s.index} exited at start: {s.log_path.read_text()[-2000:]}")
                time.sleep(0.05)
        deadline = mono() + 30
        while (self.sink_mode == "kafka-eos" and mono() < deadline
               and self.tailer.log_last(EOS_TAKEOVER) is None):
            time.sleep(0.05)
        self.shared = Shared(self.ledger, self.main_url, self.copy_url, fnid, fnid_copy, a.writers)
        self.shared.late = self.late
        # The rare behaviours (TRUNCATE, sequence caching) wait their cooldown from the start too.
        self.shared.last_admin = {"truncate": mono() - 15, "seq_cache": mono() - 15}
        letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        # Keys longer than a B-tree entry takes (2,704 bytes; schemas 1-12 kept the key in the retry
        # index, and dead-lettered such a row at its first failure): retried as any other.
        self.shared.long_keys = ["L" + "".join(self.rng.choice(letters) for _ in range(n - 1))
                                 for n in (self.rng.randrange(100, 500), self.rng.randrange(500, 1500), 2000,
                                           self.rng.randrange(2700, 4000), self.rng.randrange(4000, 6001))]
        for i in range(a.writers):
            self.writers.append(Writer(self.shared, i, self.rng.randrange(2 ** 63), self.enabled))
        self.chaos = Chaos(self, random.Random(self.rng.randrange(2 ** 63)),
                           {k: CHAOS[k] for k in self.chaos_enabled}, a.chaos_every)
        print(f"fuzz: relays {self.nrelays} ({a.relay_bin}), writers {a.writers}, {self.seconds:g} s, "
              f"sinks {', '.join(s.sink for s in self.slots)}, "
              f"latency budget {a.latency:g} s, sequence cache {cache}, behaviours {len(self.enabled)}, "
              f"chaos {', '.join(self.chaos_enabled) or 'off'}; work dir {self.workdir}", flush=True)

    def setup_kafka(self, eos=False):
        """One broker (no topic created on its own), the topics every writer uses, the reader; the
        late topics come from late_topics() during the run (not with exactly_once: a transaction
        holding a record for a missing topic cannot commit, so the whole batch would wait for it).
        Returns the relays' sink."""
        started = mono()
        # kafka-eos: the transaction state topic in one partition (its 50 by default take seconds to
        # create here at the first transaction: seed 8's first event waited 4.6 s).
        self.broker = KafkaBroker(self.workdir, ["transaction.state.log.num.partitions=1"] if eos else ()).start()
        self.reader = KafkaReader(self.tailer, self.broker.bootstrap, read_committed=eos).start()
        for topic in KAFKA_TOPICS:
            name = KAFKA_TEMPLATE.replace("{topic}", topic)
            self.broker.create_topic(name, KAFKA_PARTITIONS)
            self.reader.add_topic(name, KAFKA_PARTITIONS)
        if eos:
            self.broker.create_topic(KAFKA_PROGRESS_TOPIC, 64, {"cleanup.policy": "compact"})
        else:
            self.late = LateTopics()
            self.late_rng = random.Random(self.rng.randrange(2 ** 63))
        took = mono() - started
        if self.args.sinks is None:
            # Picked by the seed: the broker's start counts against --seconds (at most half of it).
            self.seconds = max(self.args.seconds / 2, self.args.seconds - took)
        print(f"fuzz: kafka broker {self.broker.bootstrap} ready with {len(KAFKA_TOPICS)} topics in "
              f"{took:.1f} s{'' if self.seconds == self.args.seconds else f'; writers run {self.seconds:.1f} s'}",
              flush=True)
        sink = {"name": "kafka", "type": "kafka", "brokers": self.broker.bootstrap, "topic": KAFKA_TEMPLATE,
                "delivery_timeout": f"{int(KAFKA_DELIVERY_TIMEOUT * 1000)}ms"}
        if eos:
            sink["exactly_once"] = True
        return sink

    def kafka_topics(self):
        """The Kafka topics created so far."""
        with self.ledger.lock:
            late = list(self.topic_ready)
        return [KAFKA_TEMPLATE.replace("{topic}", t) for t in KAFKA_TOPICS + late]

    def late_window(self, topic):
        """The disruption window of a late topic, from a writer's first use of it."""
        w = self.late_windows.get(topic)
        if w is None:
            w = self.ledger.window("kafka_late_topic", f"topic {topic} missing")
            w.start = min(w.start, self.late.first_use.get(topic, w.start))
            self.late_windows[topic] = w
        return w

    def create_late(self, topic):
        name = KAFKA_TEMPLATE.replace("{topic}", topic)
        w = self.late_window(topic)
        ready = self.broker.create_topic(name, KAFKA_PARTITIONS)
        self.reader.add_topic(name, KAFKA_PARTITIONS)
        with self.ledger.lock:
            self.topic_ready[topic] = ready
        self.late.remove(topic)
        w.end = ready + KAFKA_DELIVERY_TIMEOUT
        w.release_at = w.end + KAFKA_NEW_PRODUCER
        w.info += f"; ready {self.ledger.rel(ready)}"

    def late_topics(self):
        """A new late row topic at a time: writers pick it for some rows; 0.5-3 s after the first
        pick its Kafka topic is created; 6-12 s later the next one. At the writers' stop the one
        pending is created at once (the grace needs it)."""
        rng, stop = self.late_rng, self.shared.stop
        n = 0
        while not stop.is_set():
            n += 1
            topic = f"late.{n}"
            self.late.add(topic)
            while not stop.is_set() and topic not in self.late.first_use:
                stop.wait(0.05)
            if topic in self.late.first_use:
                self.late_window(topic)
            if stop.wait(rng.uniform(0.5, 3.0)):
                break
            try:
                self.create_late(topic)
            except Exception:  # noqa: BLE001 - the broker restarting: tried again at the end
                with self.ledger.lock:
                    self.ledger.fuzzer_errors.append((mono(), "late_topics", traceback.format_exc()))
                return
            # Apart enough that their windows (kafka_late_topic) do not chain: an event whose
            # deadline falls before the next one's first use is held to the usual budget.
            stop.wait(rng.uniform(6.0, 12.0))

    def kafka_holds(self):
        """The rows whose Kafka topic was created after their commit (or not yet): the sink could not
        take them before it was ready; released then plus KAFKA_LATE_ALLOWANCE (INF while missing)."""
        if self.reader is None:
            return {}, {}
        with self.ledger.lock:
            ready = dict(self.topic_ready)
            names = set(self.late.names) if self.late is not None else set()
            rows = [r for r in self.ledger.rows.values() if r.topic in names]
        holds, failures = {}, {}
        now = mono()
        # A broker restart: every event in the relays' hands then may fail (a poison key's is then
        # dead-lettered); its release is the window's (checker.apply_windows).
        restarts = [w for w in self.ledger.snapshot()[2] if w.kind == "kafka_restart"]
        if restarts:
            with self.ledger.lock:
                every = list(self.ledger.rows.values())
            for r in every:
                if r.txn.db == "main" and r.txn.end is not None and any(
                        w.start - 10 <= r.txn.end <= (INF if w.release_at is None else w.release_at) for w in restarts):
                    failures[r.uid] = [min(w.start for w in restarts if r.txn.end <= (w.release_at or INF))]
        for r in rows:
            if r.txn.db != "main" or r.txn.end is None:
                continue
            t = ready.get(r.topic, INF)
            if t > r.txn.end:
                why = (f"its Kafka topic (row topic {r.topic}) ready at {self.ledger.rel(t)}, + "
                       f"{KAFKA_LATE_ALLOWANCE:g} s for the retry" if t != INF else
                       f"its Kafka topic (row topic {r.topic}) not created yet")
                holds[r.uid] = (t + KAFKA_LATE_ALLOWANCE, why)
                failures[r.uid] = [min(t, now)]
        return holds, failures

    # --- checks

    def relay_exit_check(self):
        for s in self.slots:
            e = s.check_exit()
            if e:
                pid, code = e
                self.relay_exits.append((s.index, pid, code, mono()))
                print(f"fuzz: relay{s.index} (pid {pid}) exited by itself with code {code} at "
                      f"{self.ledger.rel(mono())}", flush=True)

    def partial_check(self, final=False, table_uids=None):
        with self.ledger.lock:
            keys = {r.key for r in self.ledger.rows.values()}
        lanes = self.lanes(keys)
        self.read_dead_letters()
        now = self.tailer.horizon()
        lines, _ = self.tailer.snapshot()
        failures, bad, refused = self.receiver.snapshot() if self.receiver else ({}, [], set())
        holds = {}
        if self.reader is not None:
            holds, failures = self.kafka_holds()
            bad = bad + self.reader.snapshot()[1]
        res = check(self.ledger, lines, now, budget=self.args.latency, final=final, relay_exits=self.relay_exits,
                    bad_lines=list(self.tailer.bad_lines) + bad, shrunk=self.tailer.shrunk(), table_uids=table_uids,
                    lanes=lanes, failures=failures, dead=self.dead, readings=self.tailer.readings_snapshot(),
                    holds=holds, no_duplicates=self.sink_mode == "kafka-eos", refused=refused)
        chaos_v = []
        if self.chaos:
            from checker import Violation
            for kind, text, t in self.chaos.problems:
                chaos_v.append(Violation(kind, text, times=[t], sig=(kind, text)))
        with self.ledger.lock:
            ferr = list(self.ledger.fuzzer_errors)
        from checker import Violation
        for t, name, tb in ferr[:5]:
            chaos_v.append(Violation("fuzzer_error", f"{name}: {tb.strip().splitlines()[-1]}\n{tb}", times=[t],
                                     sig=("fuzzer_error", name, tb[-200:])))
        res.violations.extend(chaos_v)
        elapsed = mono() - self.t_start
        for v in res.violations:
            if v.sig not in self.first_seen:
                self.first_seen[v.sig] = (elapsed, v)
                if v.kind not in self.first_kind:
                    self.first_kind[v.kind] = elapsed
                    print(f"fuzz: [{elapsed:6.1f} s] first {v.kind} violation: {v.text}", flush=True)
        return res

    def read_dead_letters(self):
        """The dead-lettered rows: the table's now, and those the TRUNCATEs removed (read under their
        lock). Kept across checks."""
        if self.receiver is None and self.reader is None:
            return
        with self.ledger.lock:
            for uid, why in self.shared.dead_letters.items():
                self.dead.setdefault(uid, why)
        try:
            with psycopg.connect(self.main_url, autocommit=True, connect_timeout=3) as c:
                found = c.execute("SELECT payload->>'uid', last_error FROM outbox_events "
                                  "WHERE dead_lettered_at IS NOT NULL").fetchall()
        except psycopg.Error:
            return      # Postgres restarting: the next check reads them
        for uid, why in found:
            self.dead.setdefault(uid, why)

    # --- the run

    def run(self):
        a = self.args
        self.t_start = mono()
        self.ledger.t0 = self.t_start      # every time printed is seconds into the run
        for w in self.writers:
            w.start()
        self.chaos.start()
        if self.late is not None:
            self.late_thread = threading.Thread(target=self.late_topics, name="late-topics", daemon=True)
            self.late_thread.start()
        end = self.t_start + self.seconds
        next_check = self.t_start + a.check_every
        stopped_early = False
        while mono() < end:
            time.sleep(min(0.5, max(0.0, end - mono())))
            self.relay_exit_check()
            if mono() >= next_check:
                next_check = mono() + a.check_every
                res = self.partial_check()
                if a.stop_on_failure and res.violations:
                    stopped_early = True
                    break
        self.writers_end = mono()
        self.shared.stop.set()
        self.chaos.stop.set()
        for w in self.writers:
            w.thread.join(90)
        if self.chaos.thread.is_alive():
            self.chaos.thread.join(120)
        for s in self.slots:
            s.cont()
        if self.late is not None:
            self.late_thread.join(60)
            for topic in sorted(self.late.names - set(self.topic_ready)):
                self.create_late(topic)
        print(f"fuzz: writers stopped at {self.ledger.rel(self.writers_end)}"
              f"{' (stopped at the first violation)' if stopped_early else ''}; grace up to {a.grace:g} s", flush=True)
        # Grace: let the relays drain what the current epoch committed.
        deadline = mono() + a.grace
        while mono() < deadline:
            self.relay_exit_check()
            lines, _ = self.tailer.snapshot()
            got = {ln.rec.get("payload", {}).get("uid") for ln in lines if isinstance(ln.rec.get("payload"), dict)}
            _, rows, _, _ = self.ledger.snapshot()
            self.read_dead_letters()
            want = [u for u, r in rows.items() if r.outcome == "committed" and r.epoch == self.ledger.epoch
                    and u not in self.dead]
            if all(u in got for u in want):
                break
            time.sleep(0.25)
        time.sleep(1.0)      # duplicates or stragglers come right behind
        self.relay_exit_check()
        table_uids = None
        try:
            with psycopg.connect(self.main_url, autocommit=True, connect_timeout=10) as c:
                table_uids = dict(c.execute("SELECT payload->>'uid', id FROM outbox_events").fetchall())
        except psycopg.Error as e:
            print(f"fuzz: cannot read the table at the end: {e}", flush=True)
        self.res = self.partial_check(final=True, table_uids=table_uids)
        self.alive_at_end = [(s.index, s.alive()) for s in self.slots]
        return self.res

    # --- the report

    def lanes(self, keys):
        keys = [k for k in set(keys) if k not in self._lanes]
        if keys:
            try:
                with psycopg.connect(self.main_url, autocommit=True, connect_timeout=3) as c:
                    self._lanes.update(c.execute("SELECT k, hashtext(k) & 63 FROM unnest(%s::text[]) AS k",
                                                 (keys,)).fetchall())
            except psycopg.Error:
                pass
        return self._lanes

    def later_writers(self, uid, rows, txns, lines_first):
        """For a late event: the transactions of its lane (this database) that began after it
        committed and before it was delivered. A relay that waits for them holds an earlier event
        for a later writer."""
        r = rows[uid]
        lanes = self.lanes([x.key for t in txns for x in t.rows] + [r.key])
        lane = lanes.get(r.key)
        seen = lines_first.get(uid)
        until = seen.hi if seen else mono()
        out = []
        for t in txns:
            if t.db != "main" or t.start <= r.txn.end or t.start >= until:
                continue
            if any(lanes.get(x.key) == lane for x in t.rows):
                out.append(t)
        return lane, out

    def history(self, v, res):
        L = self.ledger
        txns, rows, windows, _ = L.snapshot()
        lines, logs = self.tailer.snapshot()
        t_lo = min(v.times) - 2.0 if v.times else L.t0
        t_hi = max(v.times) + 1.0 if v.times else mono()
        out = []
        first = {}
        for ln in lines:
            p = ln.rec.get("payload")
            uid = p.get("uid") if isinstance(p, dict) else None
            if uid is not None and uid not in first:
                first[uid] = ln
        keys = set(v.keys)
        lanes = self.lanes(keys)
        epochs = {rows[u].epoch for u in v.uids if u in rows}
        for key in keys:
            short = key if len(key) <= 40 else f"{key[:40]}...({len(key)} chars)"
            out.append(f"    key {short!r} (lane {lanes.get(key, '?')}): ledger lines in "
                       f"{L.rel(t_lo)}..{L.rel(t_hi)}")
            krows = [r for r in rows.values() if r.key == key and (not epochs or r.epoch in epochs)
                     and (r.uid in v.uids or (r.txn.start <= t_hi and (r.txn.end or INF) >= t_lo))]
            krows.sort(key=lambda r: (r.id is None, r.id or 0, r.txn.start))
            if len(krows) > 40:
                # The 40 nearest (by id) to the events of the violation.
                marks = [rows[u].id for u in v.uids if u in rows and rows[u].id is not None]
                if marks:
                    near = sorted(krows, key=lambda r: min(abs((r.id or 0) - m) for m in marks))[:40]
                    krows = sorted(near, key=lambda r: (r.id is None, r.id or 0, r.txn.start)) + krows[40:]
            for r in krows[:40]:
                f = first.get(r.uid)
                seen = f"first seen {L.rel(f.hi)} in {f.file}" if f else "not delivered"
                d = res.deadline.get(r.uid)
                if self.receiver is not None:
                    with self.receiver.lock:
                        tries = list(self.receiver.attempts_log.get(r.uid, ()))
                    if any(status != 200 for *_, status in tries):
                        seen += "; webhook " + ", ".join(f"{L.rel(a)} {name} {status}" for a, _, name, status in tries)
                mark = "*" if r.uid in v.uids else " "
                out.append(f"     {mark}uid {r.uid:>10} id {str(r.id):>6} epoch {r.epoch} {r.behaviour:<17} txn "
                           f"{r.txn.tid:>5} {r.txn.db} {L.rel(r.txn.start)}..{L.rel(r.txn.end)} "
                           f"{str(r.outcome):<11} {seen}; deadline {L.rel(d) if d else '-'}")
            if len(krows) > 40:
                out.append(f"      ... {len(krows) - 40} more")
        # Transactions open around the times involved (both databases), locks on the rows involved.
        around = [t for t in txns if t.start <= t_hi and (t.end or INF) >= t_lo]
        lockers = [t for t in txns if t.lock_uid in v.uids]
        if around or lockers:
            out.append(f"    transactions open in {L.rel(t_lo)}..{L.rel(t_hi)} ({len(around)}; the longest 25):")
            pick = sorted(set(around), key=lambda t: -((t.end or mono()) - t.start))[:25] + lockers
            for t in sorted(set(pick), key=lambda t: t.start):
                extra = f" locks uid {t.lock_uid} from {L.rel(t.lock_start)}" if t.lock_uid else ""
                extra += f" gid {t.gid}" if t.gid else ""
                out.append(f"      txn {t.tid:>5} w{t.thread} {t.db:<4} {t.behaviour:<17} {L.rel(t.start)}.."
                           f"{L.rel(t.end)} {t.outcome} rows {len(t.rows)}{extra}")
        if v.kind in ("late", "missing") and v.uids and v.uids[0] in rows:
            lane, later = self.later_writers(v.uids[0], rows, txns, first)
            r = rows[v.uids[0]]
            # The relays' readings of the writers around its commit (their debug lines).
            for slot in sorted({q.slot for q in self.tailer.readings_snapshot()}):
                near = [q for q in self.tailer.readings_snapshot()
                        if q.slot == slot and r.txn.end - 0.3 <= q.hi <= r.txn.end + 1.0]
                shown = ", ".join(f"{L.rel(q.hi)} (.{q.generation}, last id {q.last_id}"
                                  f"{'' if q.cache == 1 else f', cache {q.cache}'})" for q in near[:12])
                out.append(f"    relay{slot}'s readings seen {L.rel(r.txn.end - 0.3)}..{L.rel(r.txn.end + 1.0)}: "
                           f"{len(near)}{': ' + shown if shown else ''}{' ...' if len(near) > 12 else ''}")
            if later:
                last_end = max((t.end or mono()) for t in later)
                f = first.get(r.uid)
                gap = f" (delivered {f.hi - last_end:+.3f} s after the last of them ended)" if f else ""
                out.append(f"    writers of lane {lane} that began after uid {r.uid} committed ({L.rel(r.txn.end)}) and "
                           f"before it was delivered: {len(later)}{gap}")
                for t in later[:12]:
                    out.append(f"      txn {t.tid:>5} w{t.thread} {t.behaviour:<17} {L.rel(t.start)}..{L.rel(t.end)} "
                               f"{t.outcome} keys {sorted({x.key[:20] for x in t.rows})[:4]}")
            f = first.get(r.uid)
            if f is not None:
                just = [t for t in txns if t.end is not None and f.lo - 0.3 <= t.end <= f.hi and t.start < f.lo]
                just += [w for w in windows if w.release_at is not None and f.lo - 0.3 <= w.release_at <= f.hi]
                if just:
                    out.append("    ended within 0.3 s before it was delivered (what it likely waited for): " + "; ".join(
                        (f"txn {t.tid} {t.db} {t.behaviour} {L.rel(t.start)}..{L.rel(t.end)}" if hasattr(t, "tid")
                         else f"{t.kind} window released {L.rel(t.release_at)}") for t in just[:8]))
            # Rolled-back rows of the lane below it that ended before it committed: gaps it must pass.
            gaps = [x for x in rows.values() if x.outcome == "rolled_back" and x.txn.db == "main" and x.id is not None
                    and r.id is not None and x.epoch == r.epoch and x.id < r.id and self._lanes.get(x.key) == lane
                    and x.txn.end is not None and x.txn.end <= r.txn.end and x.txn.end >= r.txn.end - 10]
            if gaps:
                out.append(f"    rolled-back ids of lane {lane} below it (ended in the 10 s before its commit): "
                           + ", ".join(f"{x.id} ({x.behaviour}, ended {L.rel(x.txn.end)})" for x in gaps[-6:]))
        if self.receiver is not None and v.kind in ("order", "late", "missing"):
            with self.receiver.lock:
                seen = {u: list(self.receiver.attempts_log.get(u, ())) for u in v.uids}
            for u, lst in seen.items():
                out.append(f"    webhook attempts of uid {u}: " + (", ".join(
                    f"{L.rel(a)}..{L.rel(b)} {name} {status}" for a, b, name, status in lst) or "none"))
        ws = [w for w in windows if w.start <= t_hi and (w.release_at or INF) >= t_lo - 3]
        for w in ws:
            out.append(f"    {w.kind}: {L.rel(w.start)}..{L.rel(w.end)} release {L.rel(w.release_at)} ({w.info})")
        logl = [x for x in logs if t_lo <= x[0] <= t_hi]
        if logl:
            out.append(f"    relay log lines seen in {L.rel(t_lo)}..{L.rel(t_hi)} ({len(logl)}; at most 30):")
            for t, name, _, _, d in logl[:30]:
                msg = {k: val for k, val in d.items() if k not in ("ts",)}
                out.append(f"      {L.rel(t)} {name}: {str(msg)[:300]}")
        return out

    def report(self):
        a, res, L = self.args, self.res, self.ledger
        st = res.stats
        print("fuzz: ---- figures ----")
        per_request = ", ".join(f"relay{i} {n}" for i, n in enumerate(self.per_request) if n)
        print(f"fuzz: seed {self.seed}; relays {self.nrelays} (sinks {self.sink_mode}); writers {a.writers}; "
              f"ran {self.writers_end - self.t_start:.1f} s"
              + (f"; webhook events a request: {per_request}" if per_request else ""))
        print(f"fuzz: transactions {st['transactions']} in the relays' database (committed "
              f"{st['transactions_committed']}, rolled back {st['transactions_rolled_back']}, unknown then resolved "
              f"{st['transactions_unknown']}), {st['transactions_other_db']} in the other database")
        print(f"fuzz: events written {st['events_written']}, committed {st['events_committed']} (demanded: "
              f"{st['events_demanded']}; the rest were truncated before due), rolled back "
              f"{st['events_rolled_back']}, other database {st['events_other_db']}; delivered {st['events_delivered']} "
              f"({st['lines']} lines, {st['duplicates']} duplicates); epochs {st['epochs']}; "
              f"{'rows a broker restart or a late topic may have failed' if self.reader else 'failed webhook attempts'} "
              f"{st['attempts_failed']}; dead-lettered {st['dead_lettered']} (poison keys: "
              f"{st['dead_lettered_poison_key']}; refused by the receiver: {st['dead_lettered_refused']}"
              f"{f', {self.receiver.batches_refused} requests of several refused' if self.receiver else ''}); events of keys over 2,704 bytes delivered "
              f"{st['long_keys_delivered']} ({st['long_keys_retried']} after a failed attempt)")
        if self.reader is not None:
            print(f"fuzz: kafka: records read {self.reader.records}; late topics created {len(self.topic_ready)} "
                  f"(0.5-3 s after a writer first used one); events held by a late topic {st['held_by_sink']}")
        print(f"fuzz: the relays' readings of the writers seen {st['readings']}; events held by a writer that began "
              f"after their commit, before the next reading: {st['held_by_later_writers']}")
        runs = L.behaviour_runs
        print("fuzz: behaviours: " + ", ".join(f"{k} {runs.get(k, 0)}" for k in self.enabled))
        print("fuzz: chaos: " + (", ".join(f"{k} {v}" for k, v in self.chaos.counts.items()) or "off"))
        if L.behaviour_errors:
            print("fuzz: writer errors (their transactions are resolved from the table): " +
                  "; ".join(f"{b}: {', '.join(f'{k} {n}' for k, n in d.items())}" for b, d in L.behaviour_errors.items()))
        log_lines = self.tailer.snapshot()[1]
        window = [x[4] for x in log_lines if x[4].get("msg") == "a claim held the byte window or more"]
        print(f"fuzz: claims that held the byte window or more (cut by bytes, most of them): {len(window)}, "
              f"of up to {max((d.get('events', 0) for d in window), default=0)} events")
        errs = [x for x in log_lines if x[4].get("level") == "error"]
        if errs:
            print(f"fuzz: relay error log lines: {len(errs)}; first: {errs[0][1]}: {str(errs[0][4])[:300]}")
        print(f"fuzz: relays alive at the end: {', '.join(f'relay{i} {ok}' for i, ok in self.alive_at_end)}")
        vs = res.violations
        kinds = {}
        for v in vs:
            kinds[v.kind] = kinds.get(v.kind, 0) + 1
        print(f"fuzz: violations {len(vs)}" + (": " + ", ".join(f"{k} {n}" for k, n in kinds.items()) if vs else ""))
        if vs:
            print("fuzz: first detected (s into the run): " +
                  ", ".join(f"{k} {t:.1f}" for k, t in sorted(self.first_kind.items(), key=lambda x: x[1])))
            sus = {}
            for v in vs:
                for s in v.suspects:
                    sus[(v.kind, s)] = sus.get((v.kind, s), 0) + 1
            if sus:
                print("fuzz: behaviour of the earlier row / writer in each violation: " +
                      ", ".join(f"{k}/{s} {n}" for (k, s), n in sorted(sus.items(), key=lambda x: -x[1])))
            print(f"fuzz: ---- violations (seed {self.seed}) ----")
            shown, kinds_shown = 0, set()
            # One of each kind first, then the rest, at most --details with their history.
            by_kind = {}
            for v in vs:
                by_kind.setdefault(v.kind, []).append(v)
            ordered = [lst[0] for lst in by_kind.values()] + [v for lst in by_kind.values() for v in lst[1:]]
            for v in ordered:
                print(f"fuzz: VIOLATION {v.kind}: {v.text}")
                if shown < a.details:
                    shown += 1
                    for line in self.history(v, res):
                        print(line)
                elif shown == a.details:
                    shown += 1
                    print("fuzz: (further violations listed without history)")
                kinds_shown.add(v.kind)
                if shown > a.details + 40:
                    print(f"fuzz: ... {len(vs) - 40 - a.details} more")
                    break

    # --- cleanup

    def cleanup(self, failed):
        if self._cleaned:
            return
        self._cleaned = True
        if self.shared:
            self.shared.stop.set()
        if self.chaos:
            self.chaos.stop.set()
        for s in self.slots:
            try:
                s.terminate(timeout=15)
            except Exception:  # noqa: BLE001
                pass
        self.tailer.stop()
        if self.receiver:
            self.receiver.stop()
        if self.reader:
            self.reader.stop()
        if self.broker:
            self.broker.stop()
        if self.cluster:
            self.cluster.stop()
        if self.workdir:
            shutil.rmtree(self.workdir / "pg", ignore_errors=True)
            shutil.rmtree(self.workdir / "kafka" / "data", ignore_errors=True)
            if failed or self.args.keep:
                print(f"fuzz: sink files and relay logs kept in {self.workdir}", flush=True)
            else:
                remove_workdir(self.workdir)


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        for k, (w, fn) in BEHAVIOURS.items():
            print(f"{k:<18} weight {w:<3} {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        for k, w in CHAOS.items():
            print(f"{k:<18} weight {w:<3} (chaos)")
        return 0
    fz = Fuzz(args)
    print(f"fuzz: seed {fz.seed}", flush=True)
    # SIGTERM ends the run like Ctrl-C: relays and the cluster are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    failed = True
    atexit.register(lambda: fz.cleanup(True))
    try:
        fz.setup()
        res = fz.run()
        fz.report()
        failed = bool(res.violations)
    except BaseException as e:  # noqa: BLE001 - a fuzzer that broke (or was stopped) is a failed run
        if not isinstance(e, (KeyboardInterrupt, SystemExit)):
            traceback.print_exc()
        print(f"fuzz: the run broke or was interrupted ({type(e).__name__}; seed {fz.seed})", flush=True)
        failed = True
    finally:
        fz.cleanup(failed)
    print(f"fuzz: seed {fz.seed}")
    print("fuzz: 0 passed, 1 failed" if failed else "fuzz: 1 passed, 0 failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
