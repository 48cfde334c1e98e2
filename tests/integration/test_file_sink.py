"""Issue 10, defects 1 and 6: the file sink under kill -9, and a file it cannot write at start."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import RELAY_BIN, base_config, pending, read_jsonl, run_config, wait_until, yaml_config


def file_sink(path, name="audit"):
    return {"name": name, "type": "file", "path": str(path)}


def size_of(path):
    return path.stat().st_size if path.exists() else 0


# The run used 50,000 events; 20,000 keep the test under a minute on a 2-core machine and
# tear a write now and then (a batch of 2000 x 3 kB is a 6 MB write(2)); the backlog is topped up
# until enough kills tore one.
EVENTS = 20_000
# A kill tears a write only when it lands inside a write(2) of a batch: one kill in 4 on a loaded
# machine, one in 20-30 on a quiet one. At least one real tear, cut by the next relay, is required.
MIN_KILLS, MIN_TEARS, MAX_KILLS = 25, 1, 150


def torn_tail(path):
    """Bytes after the last newline of the file: a line whose write was torn."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 8 * 1024 * 1024))
        tail = f.read()
    return len(tail) - (tail.rfind(b"\n") + 1)


def test_kill_9_while_writing_leaves_no_torn_line(db, relays, workdir):
    """Defect 1: kill -9 every 50-150 ms while the relay drains ~3 kB events in batches of 2000,
    restart it each time, then let one drain the rest: every line of the file is one JSON object,
    every id is there, and each torn line was cut (and logged) by the next relay."""
    out = workdir / "events.jsonl"

    def insert(first, count):  # ~3 kB payloads
        with db.connect() as conn:
            conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                         "SELECT 'order.paid', 'key-' || (i %% 100), "
                         "jsonb_build_object('i', i, 'pad', repeat(md5(i::text), 94)) "
                         "FROM generate_series(%s::bigint, %s::bigint) AS i", (first, first + count - 1))

    insert(1, EVENTS)
    total = EVENTS
    config = base_config(db, [file_sink(out)], batch_size=2000, lease="2s")
    rnd = random.Random(10)
    started = []
    tears = []  # bytes of the torn line each kill left, in order
    kills = 0
    while (kills < MIN_KILLS or len(tears) < MIN_TEARS) and kills < MAX_KILLS:
        if pending(db) < 6000:
            # Keep a backlog of several batches, so that every kill lands while the relay writes (a
            # fast machine drains a short backlog before the kill).
            insert(total + 1, 10_000)
            total += 10_000
        start_size = size_of(out)  # before the relay starts: it may write before relays() returns
        relay = relays(config, name=f"relay-{kills}")
        started.append(relay)
        # Kill while it drains: once it has started to write (or cut), 50-150 ms later.
        # (Or nothing left: the killed relay's last completion may commit in its backend after the
        # kill, so the rows counted pending above can be done by now.)
        wait_until(lambda: size_of(out) != start_size or not relay.alive() or pending(db) == 0, timeout=30,
                   interval=0.005, message="the relay writing")
        time.sleep(rnd.uniform(0.05, 0.15))
        relay.proc.send_signal(signal.SIGKILL)
        relay.proc.wait()
        relay.kill()
        kills += 1
        if torn := torn_tail(out):
            tears.append(torn)
    assert len(tears) >= MIN_TEARS, f"{len(tears)} torn writes in {kills} kills: the test proves too little"

    last = relays(config, name="relay-last")
    started.append(last)
    # Up before anything else: the kill loop may have drained everything already, and a SIGTERM
    # before the relay blocks it would end the process by the default action.
    last.wait_log("listening")
    wait_until(lambda: pending(db) == 0, timeout=120, message="the backlog drained after the last restart")
    assert last.stop() == 0

    # Every line parses as one JSON object (read_jsonl raises on the first line that does not).
    assert out.read_bytes().endswith(b"\n")
    lines = read_jsonl(out)
    got = {line["id"] for line in lines}
    ids = set(range(1, total + 1))
    assert got == ids, f"missing ids: {sorted(ids - got)[:10]}"
    assert all(line["payload"]["i"] == line["id"] for line in lines)
    # Each torn line was cut by the relay started after the kill, which said so.
    cuts = [l for r in started for l in r.logs()
            if l.get("msg", "").startswith("file sink cut an incomplete last line")]
    assert [c["bytes_cut"] for c in cuts] == tears
    assert all(c["level"] == "warn" and c["path"] == str(out) and c["sink"] == "audit" for c in cuts)
    print(f"{kills} kills, {len(tears)} torn lines cut, {len(lines)} lines for {total} events")


def last_stderr_line(proc):
    return proc.stderr.strip().splitlines()[-1]


def refusal_config(path):
    return {"database": {"url": "postgresql://relay:hunter22@127.0.0.1:1/app"},
            "sinks": [{"name": "console", "type": "stdout"}, file_sink(path)]}


def test_a_missing_directory_is_refused_at_start_naming_the_key(workdir):
    """Defect 6: exit 2 at start naming sinks[N].path, not a retry per batch until dead letters."""
    path = workdir / "not-yet" / "events.jsonl"
    proc = run_config(workdir, refusal_config(path))
    assert proc.returncode == 2, proc.stderr
    assert last_stderr_line(proc) == (
        f"outbox-relay: config error: sinks[1].path: cannot open {path} for appending: No such file or directory")
    assert "hunter22" not in proc.stderr + proc.stdout
    assert not path.parent.exists()


def test_a_path_under_a_file_is_refused_at_start(workdir):
    (workdir / "a-file").write_text("x")
    path = workdir / "a-file" / "events.jsonl"
    proc = run_config(workdir, refusal_config(path))
    assert proc.returncode == 2, proc.stderr
    assert last_stderr_line(proc) == (
        f"outbox-relay: config error: sinks[1].path: cannot open {path} for appending: Not a directory")


@pytest.fixture
def open_dir():
    """A temp dir every user can reach (pytest's own live under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="outbox-file-sink-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_directory_the_relay_user_cannot_write_is_refused_at_start(open_dir):
    read_only = open_dir / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    path = read_only / "events.jsonl"
    config_path = open_dir / "config-under-test.yaml"
    config_path.write_text(yaml_config(refusal_config(path)))
    config_path.chmod(0o644)
    cmd = [str(RELAY_BIN), "run", "--config", str(config_path)]
    if os.geteuid() == 0:
        # Root writes past permission bits: run the relay as an unprivileged service user would.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv(1): cannot run the relay as an unprivileged user")
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert last_stderr_line(proc) == (
        f"outbox-relay: config error: sinks[1].path: cannot open {path} for appending: Permission denied")
    assert not path.exists()


def test_a_disk_that_fails_after_start_still_retries(db, relays, workdir):
    """Defect 6, the other half: a file that opened at start but fails later is a retry, not an exit."""
    real = workdir / "real.jsonl"
    path = workdir / "events.jsonl"
    path.symlink_to("/dev/full")  # opens, but every write fails with ENOSPC, as on a full disk
    relay = relays(base_config(db, [file_sink(path)], backoff={"initial": "100ms", "max": "200ms"}))
    [event_id] = db.insert([("order.paid", "k", {"a": 1})])
    wait_until(lambda: db.scalar("SELECT attempts FROM outbox_events WHERE id = %s", (event_id,)) >= 2,
               message="retries while the disk is full")
    row = db.query("SELECT last_error, processed_at, dead_lettered_at FROM outbox_events WHERE id = %s", (event_id,))
    assert row == [("audit: write: No space left on device", None, None)]
    assert relay.alive()
    path.unlink()
    path.symlink_to(real)
    wait_until(lambda: db.scalar("SELECT processed_at IS NOT NULL FROM outbox_events WHERE id = %s", (event_id,)),
               message="delivered once the disk is back")
    assert [line["id"] for line in read_jsonl(real)] == [event_id]
    assert relay.stop() == 0
