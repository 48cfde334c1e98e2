"""Reads a file sink's JSON lines as they are appended, on a thread of its own, and notes when each
line was first read: what the latency and order checks of the integration tests measure against."""
from __future__ import annotations

import json
import threading
import time


class SinkTail:
    """`records`: every (record, monotonic time read) in file order (ids may repeat: a sequence
    restart, a redelivery); `seen`: id -> when it was first read; `lines`: the records alone."""

    def __init__(self, path, interval=0.003):
        self.path = path
        self.interval = interval
        self.seen = {}
        self.lines = []
        self._records = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        buf, pos = b"", 0
        while not self._stop.is_set():
            if self.path.exists():
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                buf += chunk
                now = time.monotonic()
                *complete, buf = buf.split(b"\n")
                with self._lock:
                    for raw in complete:
                        line = json.loads(raw)
                        self.lines.append(line)
                        self._records.append((line, now))
                        self.seen.setdefault(line["id"], now)
            time.sleep(self.interval)

    def has(self, event_id) -> bool:
        with self._lock:
            return event_id in self.seen

    def seen_at(self, event_id):
        with self._lock:
            return self.seen.get(event_id)

    def snapshot(self, where=lambda r: True):
        """[(record, time read)] in file order, for the records `where` accepts."""
        with self._lock:
            return [(r, t) for r, t in self._records if where(r)]

    def ids(self, where=lambda r: True) -> list:
        return [r["id"] for r, _ in self.snapshot(where)]

    def records(self) -> list:
        with self._lock:
            return list(self.lines)

    def stop(self):
        self._stop.set()
        self._thread.join()
