"""The fuzzer's moving parts that are not writers: a throwaway PostgreSQL cluster, relays as child
processes (killed, stopped and restarted by the chaos thread), one tailer thread that reads every
sink file and relay log as it grows, a webhook receiver that fails some attempts, and libpq's
fastpath call through ctypes."""
from __future__ import annotations

import ctypes
import gc
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from ledger import POISON_PREFIX

ROOT = Path(__file__).resolve().parents[2]
PG_CLUSTER = ROOT / "scripts" / "pg-cluster.sh"


def mono() -> float:
    return time.monotonic()


# ---------------------------------------------------------------------------------------------
# The cluster


class Cluster:
    """One throwaway PostgreSQL 15 cluster (scripts/pg-cluster.sh), PG_FAST=1, in a temp dir."""

    def __init__(self, base: Path):
        self.base = base
        self.dir = base / "pg"
        self.url = None
        self.stopped = False

    def start(self):
        out = subprocess.check_output([str(PG_CLUSTER), "start", str(self.dir)],
                                      env={**os.environ, "PG_FAST": "1"}, text=True, timeout=120)
        self.url = out.strip().splitlines()[-1]
        assert "@127.0.0.1:" in self.url, self.url
        return self

    def url_for(self, dbname: str) -> str:
        return self.url.rsplit("/", 1)[0] + "/" + dbname

    def restart(self):
        subprocess.check_call([str(PG_CLUSTER), "restart", str(self.dir)], timeout=120,
                              stdout=subprocess.DEVNULL)

    def stop(self):
        if not self.stopped and self.url:
            self.stopped = True
            subprocess.call([str(PG_CLUSTER), "stop", str(self.dir)], timeout=120)


def make_workdir() -> Path:
    base = Path(tempfile.mkdtemp(prefix="outbox-fuzz-"))
    os.chmod(base, 0o755)
    return base


def remove_workdir(base: Path):
    shutil.rmtree(base, ignore_errors=True)


def run_cli(relay_bin: str, *args, env=None, timeout=120):
    proc = subprocess.run([relay_bin, *args], env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"outbox-relay {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


# ---------------------------------------------------------------------------------------------
# Relays


class RelaySlot:
    """One relay position: one sink file (kept across restarts: the sink cuts a partial last line
    when it opens it again) and one log file per incarnation. Every incarnation is a child process
    of this fuzzer; only those are signalled."""

    def __init__(self, index: int, relay_bin: str, db_url: str, workdir: Path, tailer: "Tailer",
                 receiver: "Receiver | None" = None, kafka: "dict | None" = None, events_per_request: int = 1):
        self.index = index
        self.relay_bin = relay_bin
        self.workdir = workdir
        self.tailer = tailer
        self.sink_path = workdir / f"relay{index}.jsonl"
        self.config_path = workdir / f"relay{index}.yaml"
        config = {
            "database": {"url": db_url, "reconnect": {"initial": "100ms", "max": "1s"}},
            # in_flight_bytes at its least (1 MiB): claims of the writers' large events are cut by bytes.
            "relay": {"batch_size": 500, "in_flight_bytes": 1 << 20, "sweep_interval": "1h", "lease": "60s",
                      "rebalance_interval": "500ms",
                      "backoff": {"initial": "100ms", "max": "2s"}, "instance_id": f"fuzz-relay-{index}",
                      "writer_hold_warning": "5s"},
            "http": {"enabled": False},
            # debug: every reading of the writers is logged (the tailer keeps them as Reading).
            "log": {"level": "debug"},
            "sinks": [{"name": "audit", "type": "file", "path": str(self.sink_path)}],
        }
        self.sink = "file"
        if receiver is not None:
            # CloudEvents binary mode: the key and topic come as ce-subject and ce-type; with several
            # events a request, a JSON array of structured CloudEvents.
            self.sink = "webhook"
            config["sinks"] = [{"name": "hook", "type": "webhook", "url": receiver.url(f"relay{index}"),
                                "format": "cloudevents", "timeout": "5s", "max_in_flight": 4,
                                "events_per_request": events_per_request}]
        if kafka is not None:
            self.sink = "kafka"
            config["sinks"] = [kafka]
        self.config = config
        self.config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        self.proc = None
        self.generation = 0
        self.log_path = None
        self._log = None
        self.killed_by_us = set()   # pids we killed or stopped on purpose
        self.exits = []             # (pid, returncode, monotonic time noticed, by_us)
        self.stopped = False        # SIGSTOPped right now
        if receiver is None and kafka is None:
            tailer.add_sink(self.sink_path, f"relay{index}")

    def start(self):
        self.generation += 1
        self.log_path = self.workdir / f"relay{self.index}.{self.generation}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([self.relay_bin, "run", "--config", str(self.config_path)],
                                     stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL)
        self.tailer.add_log(self.log_path, f"relay{self.index}.{self.generation}", self.index, self.generation)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.killed_by_us.add(self.proc.pid)
            if self.stopped:
                self.cont()
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.exits.append((self.proc.pid, self.proc.returncode, mono(), True))
        if self._log:
            self._log.close()
            self._log = None

    def reload(self, batch_size: int, events_per_request: int | None = None):
        """Rewrites the config file with another batch_size (and a webhook's events_per_request) and
        sends SIGHUP: the relay re-reads it without a restart, keeps its sink when the sink's entry
        is unchanged and rebuilds it otherwise (between two batches, the old one flushed first)."""
        self.config["relay"]["batch_size"] = batch_size
        if events_per_request is not None and self.sink == "webhook":
            self.config["sinks"][0]["events_per_request"] = events_per_request
        self.config_path.write_text(json.dumps(self.config, indent=2))
        if self.alive():
            self.proc.send_signal(signal.SIGHUP)

    def stop_signal(self):
        if self.alive():
            self.proc.send_signal(signal.SIGSTOP)
            self.stopped = True

    def cont(self):
        if self.proc is not None and self.stopped:
            self.stopped = False
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)

    def terminate(self, timeout=15.0):
        """SIGTERM (the end of the run); SIGKILL if it does not exit in time. Returns the code."""
        if self.proc is None:
            return None
        if self.stopped:
            self.cont()
        if self.proc.poll() is None:
            self.killed_by_us.add(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def check_exit(self):
        """A relay that exited by itself: (pid, code), noted once."""
        if self.proc is not None and self.proc.poll() is not None and self.proc.pid not in self.killed_by_us:
            if not any(e[0] == self.proc.pid for e in self.exits):
                self.exits.append((self.proc.pid, self.proc.returncode, mono(), False))
                return self.proc.pid, self.proc.returncode
        return None


# ---------------------------------------------------------------------------------------------
# The tailer


class SinkLine:
    __slots__ = ("rec", "file", "index", "lo", "hi")

    def __init__(self, rec, file, index, lo, hi):
        self.rec, self.file, self.index, self.lo, self.hi = rec, file, index, lo, hi


class Reading:
    """A relay's reading of the writers (its debug line "writers read"). The line was written after
    lo (the start of the previous read of the log, which did not see it) and before hi (the end of
    the read that did); the reading came before the line. A writer that began after hi took the
    table's lock after the reading, so it drew only ids above last_id, and the relay knows it."""
    __slots__ = ("lo", "hi", "slot", "generation", "last_id", "cache")

    def __init__(self, lo, hi, slot, generation, last_id, cache):
        self.lo, self.hi, self.slot, self.generation = lo, hi, slot, generation
        self.last_id, self.cache = last_id, cache


class _Followed:
    def __init__(self, path, name, kind, slot=None, generation=None):
        self.path, self.name, self.kind, self.slot, self.generation = path, name, kind, slot, generation
        self.consumed = 0          # offset after the last complete line read
        self.prev_read_start = None
        self.horizon = None        # every line complete before this time is in Tailer.lines
        self.count = 0
        self.shrunk = []           # (monotonic time, size, consumed) when the file got shorter


class Tailer:
    """One thread reads every sink file and relay log as it grows, every few ms. Each complete sink
    line gets an interval [lo, hi]: its newline was written after lo (the start of the previous read
    of that file, which did not see it) and before hi (the end of the read that did). Only complete
    lines are consumed: a partial last line cut by a restarted relay's sink is never seen."""

    def __init__(self, interval=0.004):
        self.interval = interval
        self.lock = threading.Lock()
        self.sinks: list[_Followed] = []
        self.logs: list[_Followed] = []
        self.lines: list[SinkLine] = []         # every sink line, in the order read
        self.log_lines: list[tuple] = []        # (monotonic seen, relay name, slot, generation, dict)
        self.readings: list[Reading] = []       # the relays' readings of the writers, in the order read
        self.bad_lines: list[tuple] = []        # (file, raw) that did not parse
        self.start_time = mono()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailer", daemon=True)
        self.receivers: list["Receiver"] = []

    def add_sink(self, path, name):
        with self.lock:
            self.sinks.append(_Followed(path, name, "sink"))

    def add_log(self, path, name, slot, generation):
        with self.lock:
            self.logs.append(_Followed(path, name, "log", slot, generation))

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def _read(self, f: _Followed):
        t_before = mono()
        try:
            with open(f.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < f.consumed:
                    f.shrunk.append((t_before, size, f.consumed))
                    f.consumed = size  # a complete line was cut: noted, reported by the checker
                fh.seek(f.consumed)
                chunk = fh.read()
        except FileNotFoundError:
            f.prev_read_start = t_before
            return [], t_before, mono()
        t_after = mono()
        end = chunk.rfind(b"\n")
        if end < 0:
            f.prev_read_start = t_before
            return [], t_before, t_after
        complete = chunk[:end].split(b"\n")
        f.consumed += end + 1
        return complete, t_before, t_after

    def poll_once(self):
        with self.lock:
            sinks, logs = list(self.sinks), list(self.logs)
        for f in sinks:
            lo = f.prev_read_start if f.prev_read_start is not None else self.start_time
            raws, t_before, t_after = self._read(f)
            f.prev_read_start = t_before
            new = []
            for raw in raws:
                try:
                    rec = json.loads(raw)
                except ValueError:
                    self.bad_lines.append((f.name, raw[:300]))
                    continue
                new.append(SinkLine(rec, f.name, f.count, lo, t_after))
                f.count += 1
            with self.lock:
                self.lines.extend(new)
                f.horizon = t_before
        for f in logs:
            lo = f.prev_read_start if f.prev_read_start is not None else self.start_time
            raws, t_before, t_after = self._read(f)
            f.prev_read_start = t_before
            new, readings = [], []
            for raw in raws:
                try:
                    d = json.loads(raw)
                except ValueError:
                    d = {"msg": raw.decode(errors="replace")[:500]}
                if d.get("msg") == "writers read":
                    readings.append(Reading(lo, t_after, f.slot, f.generation, d.get("last_id", -1),
                                            d.get("sequence_cache", 1)))
                    continue
                new.append((t_after, f.name, f.slot, f.generation, d))
            if new or readings:
                with self.lock:
                    self.log_lines.extend(new)
                    self.readings.extend(readings)

    def _run(self, max_seconds=4 * 3600):
        deadline = mono() + max_seconds
        while not self._stop.is_set() and mono() < deadline:
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001 - a tailer must not die silently
                self.bad_lines.append(("tailer", repr(e).encode()))
            self._stop.wait(self.interval)

    def snapshot(self):
        with self.lock:
            return list(self.lines), list(self.log_lines)

    def readings_snapshot(self):
        with self.lock:
            return list(self.readings)

    def horizon(self) -> float:
        """A time before which every complete sink line has been read: the earliest start of the
        last read of each sink file."""
        with self.lock:
            starts = [f.horizon for f in self.sinks]
        starts += [r.horizon() for r in self.receivers]
        return min((s for s in starts if s is not None), default=self.start_time) if starts else mono()

    def reading_seen(self, slot, generation, after):
        """The hi of a relay incarnation's first reading of the writers seen after `after`, or None."""
        with self.lock:
            for q in self.readings:
                if q.slot == slot and q.generation == generation and q.lo >= after:
                    return q.hi
        return None

    def log_last(self, pattern):
        """(time, slot, generation) of the newest log line of any relay whose msg contains pattern,
        or None."""
        with self.lock:
            for t, _, s, g, d in reversed(self.log_lines):
                if pattern in str(d.get("msg", "")):
                    return t, s, g
        return None

    def log_seen(self, slot, generation, pattern, after=0.0):
        """The monotonic time a relay incarnation's log first showed msg containing pattern after
        `after`, or None."""
        with self.lock:
            for t, _, s, g, d in self.log_lines:
                if s == slot and g == generation and t >= after and pattern in str(d.get("msg", "")):
                    return t
        return None

    def shrunk(self):
        with self.lock:
            return [(f.name, x) for f in self.sinks for x in f.shrunk]


# ---------------------------------------------------------------------------------------------
# The webhook receiver

# CloudEvents context attributes sent as ce-* headers; any other ce-* header is a row header.
CE_ATTRIBUTES = {"specversion", "id", "source", "type", "subject", "time"}


class Receiver:
    """One HTTP server for the relays whose sink is a webhook (a path per relay). It answers 503
    to some attempts (the relay must retry them, and hold their key's later events meanwhile) and
    200 to the rest; each 200 becomes a SinkLine of `relay<i>.hook` in the tailer, with lo when the
    request arrived and hi when it was recorded. The webhook sink sends one key's events one after
    another, so within one relay a key's lines are in delivery order. A request of several events
    (events_per_request) fails whole when any of its events' attempts fails (a key is at most once
    in a request), and its lines are recorded in body order.

    It also refuses some events for good, as a receiver that validates what it is sent: every
    request that carries one of them is answered 422, a request of several too (the relay must then
    send each of its events again alone, deliver the others, and dead-letter only the refused one;
    its key's later events go on). `refuse_rate` of the uids, by a hash of the seed and the uid.

    Which attempts fail: the attempt number of a uid (counted over every relay) and a hash of the
    seed and the uid decide it: `fail_rate` of first attempts, `often_rate` for keys longer than
    `long_bytes` (retried as any other since schema 13; before it their failed attempt could not be
    recorded) and for the poison keys (their failed attempt cannot be recorded: the relay must
    dead-letter the row and let the key's later events go), and a few second attempts; never a
    third, so that every event gets through."""

    def __init__(self, tailer: "Tailer", seed: int, fail_rate=0.03, often_rate=0.5, long_bytes=2704,
                 refuse_rate=0.005):
        self.tailer = tailer
        self.seed = seed
        self.fail_rate, self.often_rate, self.long_bytes = fail_rate, often_rate, long_bytes
        self.refuse_rate = refuse_rate
        self.lock = threading.Lock()
        self.attempts = {}        # uid -> attempts so far
        self.failures = {}        # uid -> [monotonic time of each 503, and of each 422 of a refused uid]
        self.refused = set()      # uids answered 422 in a request of their own: the relay dead-letters them
        self.batches_refused = 0  # requests of several answered 422
        self.attempts_log = {}    # uid -> [(arrival, answered, relay path, status)], for the report
        self.counts = {}          # file name -> lines so far
        self.in_flight = {}       # request serial -> arrival time
        self.serial = 0
        self.bad = []             # (file, text): requests that could not be read
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"     # keep-alive, as the relay's libcurl expects

            def do_POST(self):  # noqa: N802 - the http.server API
                receiver._handle(self)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass     # a connection reset by a relay killed mid-request: expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="receiver", daemon=True)
        tailer.receivers.append(self)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/{path}"

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def horizon(self) -> float:
        """Every delivery recorded before this time is in the tailer: the arrival of the oldest
        request not yet answered, or now."""
        with self.lock:
            return min(self.in_flight.values(), default=mono())

    def _fails(self, uid, attempt, key) -> bool:
        if attempt > 2:
            return False
        h = random.Random(f"{self.seed}:{uid}:{attempt}").random()
        if attempt == 2:
            return h < self.fail_rate / 3
        often = len(key.encode()) > self.long_bytes or key.startswith(POISON_PREFIX)
        return h < (self.often_rate if often else self.fail_rate)

    def _refuses(self, uid) -> bool:
        return random.Random(f"{self.seed}:{uid}:refuse").random() < self.refuse_rate

    def _handle(self, h):
        arrived = mono()
        with self.lock:
            self.serial += 1
            serial = self.serial
            self.in_flight[serial] = arrived
        try:
            name = h.path.strip("/") + ".hook"
            body = h.rfile.read(int(h.headers.get("content-length", "0")))
            try:
                recs = self._records(h.headers, body)
            except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
                with self.lock:
                    self.bad.append((name, f"{e!r}: {body[:200]!r}"))
                self._answer(h, 400, b"unreadable")
                return
            fail = False
            with self.lock:
                uids = [rec["payload"].get("uid") if isinstance(rec["payload"], dict) else None for rec in recs]
                refusing = [uid for uid in uids if uid is not None and self._refuses(uid)]
                for uid, rec in zip(uids, recs):
                    attempt = self.attempts.get(uid, 0) + 1
                    self.attempts[uid] = attempt
                    fail = (uid is not None and self._fails(uid, attempt, rec["key"])) or fail
                status = 422 if refusing else 503 if fail else 200
                for uid in uids:
                    if status == 503 or uid in refusing:
                        self.failures.setdefault(uid, []).append(mono())
                    self.attempts_log.setdefault(uid, []).append((arrived, mono(), name, status))
                if refusing and len(uids) == 1:
                    self.refused.add(uids[0])
                self.batches_refused += bool(refusing) and len(uids) > 1
            if status == 422:
                self._answer(h, 422, b"fuzz: this event is refused")
                return
            if fail:
                self._answer(h, 503, b"fuzz: this attempt fails")
                return
            with self.tailer.lock:
                for rec in recs:
                    index = self.counts.get(name, 0)
                    self.counts[name] = index + 1
                    self.tailer.lines.append(SinkLine(rec, name, index, arrived, mono()))
            self._answer(h, 200, b"")
        finally:
            with self.lock:
                self.in_flight.pop(serial, None)

    @staticmethod
    def _records(headers, body) -> list:
        """The events of a request: one in binary mode (ce-* headers, the payload as the body), or
        a JSON array of structured CloudEvents."""
        if headers.get("content-type", "").startswith("application/cloudevents-batch+json"):
            out = []
            for ce in json.loads(body):
                out.append({"id": int(ce["id"]), "key": ce.get("subject", ""), "topic": ce.get("type"),
                            "headers": {k: v for k, v in ce.items()
                                        if k not in CE_ATTRIBUTES and k not in ("data", "datacontenttype")},
                            "payload": ce["data"]})
            return out
        ce = {k.lower()[3:]: urllib.parse.unquote(v, errors="strict") for k, v in headers.items()
              if k.lower().startswith("ce-")}
        return [{"id": int(headers["webhook-id"]), "key": ce.get("subject", ""), "topic": ce.get("type"),
                 "headers": {k: v for k, v in ce.items() if k not in CE_ATTRIBUTES}, "payload": json.loads(body)}]

    @staticmethod
    def _answer(h, status, body):
        try:
            h.send_response(status)
            h.send_header("content-length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass     # the relay was killed mid-request

    def snapshot(self):
        """Failed attempts by uid, unreadable requests, and the uids refused alone."""
        with self.lock:
            return {u: list(t) for u, t in self.failures.items()}, list(self.bad), set(self.refused)


# ---------------------------------------------------------------------------------------------
# libpq's fastpath call (PQfn), through ctypes


class FastpathConn:
    """A libpq connection of its own (ctypes on libpq.so.5; CDLL releases the GIL in each call) that
    runs simple queries and calls a function by OID through PQfn (protocol message F)."""

    PGRES_COMMAND_OK, PGRES_TUPLES_OK = 1, 2
    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            lib = ctypes.CDLL("libpq.so.5")
            lib.PQconnectdb.restype = ctypes.c_void_p
            lib.PQconnectdb.argtypes = [ctypes.c_char_p]
            lib.PQstatus.restype = ctypes.c_int
            lib.PQstatus.argtypes = [ctypes.c_void_p]
            lib.PQerrorMessage.restype = ctypes.c_char_p
            lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
            lib.PQexec.restype = ctypes.c_void_p
            lib.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            lib.PQresultStatus.restype = ctypes.c_int
            lib.PQresultStatus.argtypes = [ctypes.c_void_p]
            lib.PQfn.restype = ctypes.c_void_p
            lib.PQfn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                 ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
            lib.PQclear.argtypes = [ctypes.c_void_p]
            lib.PQfinish.argtypes = [ctypes.c_void_p]
            cls._lib = lib
        return cls._lib

    def __init__(self, url):
        lib = self.lib()
        self.conn = lib.PQconnectdb(url.encode())
        if not self.conn or lib.PQstatus(self.conn) != 0:
            msg = lib.PQerrorMessage(self.conn) if self.conn else b"no memory"
            self.close()
            raise ConnectionError(f"fastpath connect: {msg!r}")

    def exec(self, sql: str):
        lib = self.lib()
        res = lib.PQexec(self.conn, sql.encode())
        status = lib.PQresultStatus(res) if res else -1
        lib.PQclear(res)
        if status not in (self.PGRES_COMMAND_OK, self.PGRES_TUPLES_OK):
            raise ConnectionError(f"fastpath exec {sql[:60]!r}: {lib.PQerrorMessage(self.conn)!r}")

    def call_int(self, fnid: int) -> int:
        lib = self.lib()
        value, length = ctypes.c_int(0), ctypes.c_int(0)
        res = lib.PQfn(self.conn, fnid, ctypes.byref(value), ctypes.byref(length), 1, None, 0)
        ok = bool(res) and lib.PQresultStatus(res) == self.PGRES_COMMAND_OK
        lib.PQclear(res)
        if not ok or length.value != 4:
            raise ConnectionError(f"PQfn: {lib.PQerrorMessage(self.conn)!r}")
        return value.value

    def broken(self) -> bool:
        return not self.conn or self.lib().PQstatus(self.conn) != 0

    def close(self):
        if self.conn:
            self.lib().PQfinish(self.conn)
            self.conn = None


# ---------------------------------------------------------------------------------------------
# Kafka (--sinks kafka): one broker, the topics, a reader of every topic

sys.path.insert(0, str(ROOT / "tests" / "kafka"))
from broker_process import BROKER_SH, BrokerProcess  # noqa: E402
# Every topic the fuzzer creates: each record carries the broker's append time (ms), the only
# clock two partitions share.
TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}


def kafka_interval(ts_ms: int, wall_minus_mono: float):
    """A record's delivery instant as the checker's [lo, hi] in monotonic seconds: the broker
    appended it within the millisecond ts_ms (LogAppendTime; this machine's clock). hi stays below
    the next millisecond's lo, so two records of different partitions are ordered when their append
    times differ and ambiguous (neither before the other) when they are equal."""
    lo = ts_ms / 1000.0 - wall_minus_mono
    return lo, lo + 0.0009


class KafkaBroker(BrokerProcess):
    """A single-node KRaft broker (tests/kafka/broker.sh) in the work dir, on a free port, that creates
    no topic on its own (auto.create.topics.enable=false): a record for a topic the fuzzer has not
    created yet fails with UNKNOWN_TOPIC_OR_PART, which the relay retries."""

    def __init__(self, base: Path, extra=()):
        super().__init__(base / "kafka", ["auto.create.topics.enable=false", *extra])
        self.stopped = False
        self._admin = None

    def admin(self):
        from confluent_kafka.admin import AdminClient
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def create_topic(self, name: str, partitions: int = 3, config=None, timeout=30.0) -> float:
        """Creates the topic and waits until every partition has a leader; returns the monotonic time
        it was seen ready. Already there: fine."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic
        deadline = mono() + timeout
        admin = self.admin()
        while True:
            try:
                fut = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                    config={**TOPIC_CONFIG, **(config or {})})])[name]
                fut.result(timeout=10)
                break
            except Exception as e:  # noqa: BLE001 - KafkaException, or a timeout while the broker restarts
                if "TOPIC_ALREADY_EXISTS" in str(e) or "already exists" in str(e):
                    break
                if mono() > deadline:
                    raise
                time.sleep(0.2)
        while mono() < deadline:
            try:
                md = admin.list_topics(name, timeout=5).topics.get(name)
            except KafkaException:
                md = None
            if md and md.error is None and len(md.partitions) == partitions and all(
                    p.leader >= 0 for p in md.partitions.values()):
                return mono()
            time.sleep(0.05)
        raise RuntimeError(f"kafka topic {name} did not become ready within {timeout:g} s")

    def stop(self):
        if not self.stopped and self.bootstrap:
            self.stopped = True
            self._admin = None     # destroyed before the broker goes: no reconnect noise on stderr
            gc.collect()
            try:
                self.run("stop", str(self.dir), timeout=60)
            except Exception:  # noqa: BLE001 - the end of the run: kill it
                subprocess.call([str(BROKER_SH), "kill", str(self.dir)], timeout=30)


class KafkaReader:
    """One consumer (confluent-kafka, no group: partitions assigned by hand from the beginning) that
    reads every topic the fuzzer created, and puts each record into the tailer as a SinkLine of
    file `<topic>/<partition>` (index = offset: a partition's order is exact), with [lo, hi] from its
    LogAppendTime (kafka_interval). Its horizon: every few hundred ms it reads the high watermarks of
    every partition (t0 taken before) and, once it has consumed up to them, every record appended
    before t0 is in the tailer."""

    def __init__(self, tailer: "Tailer", bootstrap: str, read_committed=False):
        from confluent_kafka import Consumer
        self.tailer = tailer
        # read_committed (kafka-eos): a record is visible from its transaction's commit on, which its
        # append time precedes: its interval is [append, read] instead.
        self.read_committed = read_committed
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-reader",
                                  "enable.auto.commit": False, "enable.partition.eof": False,
                                  "fetch.wait.max.ms": 10,
                                  "isolation.level": "read_committed" if read_committed else "read_uncommitted",
                                  "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500})
        self.lock = threading.Lock()
        self.to_assign = []            # [(topic, partitions)] not assigned yet
        self.assigned = []             # [TopicPartition]
        self.position = {}             # (topic, partition) -> next offset
        self.wall_minus_mono = time.time() - mono()
        self._horizon = mono()
        self.bad = []                  # (file, text)
        self.records = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kafka-reader", daemon=True)
        tailer.receivers.append(self)

    def add_topic(self, topic: str, partitions: int):
        with self.lock:
            self.to_assign.append((topic, partitions))

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self._stop.set()
        self.thread.join(10)
        try:
            self.consumer.close()
        except Exception:  # noqa: BLE001
            pass

    def horizon(self) -> float:
        with self.lock:
            return self._horizon

    def snapshot(self):
        return {}, list(self.bad)

    def _record(self, m):
        topic, part = m.topic(), m.partition()
        name = f"{topic}/{part}"
        kind, ts = m.timestamp()
        try:
            if kind != 2:     # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
                raise ValueError(f"timestamp type {kind}, not LogAppendTime")
            headers = {}
            for hname, hval in m.headers() or []:
                headers[hname] = hval.decode() if hval is not None else None
            rec = {"id": int(headers.pop("outbox-id")), "key": (m.key() or b"").decode(),
                   "topic": headers.pop("outbox-topic", None), "payload": json.loads(m.value()),
                   "headers": {k: v for k, v in headers.items() if not k.startswith("outbox-")}}
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            self.bad.append((name, f"offset {m.offset()}: {e!r}: {(m.value() or b'')[:200]!r}"))
            return
        lo, hi = kafka_interval(ts, self.wall_minus_mono)
        if self.read_committed:
            hi = max(hi, mono())
        with self.tailer.lock:
            self.tailer.lines.append(SinkLine(rec, name, m.offset(), lo, hi))
        self.records += 1

    def _run(self):
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
        target, t0, next_sync = None, None, mono()
        while not self._stop.is_set():
            try:
                with self.lock:
                    new, self.to_assign = self.to_assign, []
                if new:
                    tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t, n in new for p in range(n)]
                    self.consumer.incremental_assign(tps)
                    self.assigned += [TopicPartition(t, p) for t, n in new for p in range(n)]
                    for t, n in new:
                        for p in range(n):
                            self.position.setdefault((t, p), 0)
                for m in self.consumer.consume(num_messages=1000, timeout=0.02):
                    if m.error():
                        continue
                    self.position[(m.topic(), m.partition())] = m.offset() + 1
                    self._record(m)
                if target is None and mono() >= next_sync:
                    t0 = mono()
                    target = {}
                    for tp in self.assigned:
                        _, high = self.consumer.get_watermark_offsets(tp, timeout=2, cached=False)
                        target[(tp.topic, tp.partition)] = high
                if target is not None and self.read_committed and any(
                        self.position.get(k, 0) < h for k, h in target.items()):
                    # A commit marker takes an offset no record has: the consumer's own position
                    # passes it.
                    for tp in self.consumer.position(self.assigned):
                        if tp.offset >= 0:
                            k = (tp.topic, tp.partition)
                            self.position[k] = max(self.position.get(k, 0), tp.offset)
                if target is not None and all(self.position.get(k, 0) >= h for k, h in target.items()):
                    with self.lock:
                        self._horizon = t0
                    target, next_sync = None, mono() + 0.2
            except KafkaException:
                target, next_sync = None, mono() + 0.5     # the broker restarting: the horizon waits
                self._stop.wait(0.1)
            except Exception as e:  # noqa: BLE001 - a reader must not die silently
                self.bad.append(("kafka-reader", repr(e)))
                self._stop.wait(0.1)
