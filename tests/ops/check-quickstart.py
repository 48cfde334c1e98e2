#!/usr/bin/env python3
"""Runs the README's first command, scripts/quickstart.sh, for a few seconds and checks what it
printed: every event the writer committed reached the stdout sink exactly once and in order
(keys order-1 .. order-N, N >= 3), and `outbox-relay status` reports nothing pending.

    tests/ops/check-quickstart.py [SECONDS]     (default 4)

Exits 1 naming what failed, with the quickstart's output."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
seconds = sys.argv[1] if len(sys.argv) > 1 else "4"
run = subprocess.run([str(root / "scripts/quickstart.sh")], cwd=root, capture_output=True, text=True,
                     env={**os.environ, "QUICKSTART_SECONDS": seconds}, timeout=900)


def fail(why: str) -> None:
    print(f"FAIL: quickstart: {why}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}")
    sys.exit(1)


if run.returncode != 0:
    fail(f"exited {run.returncode}")
keys = []
for line in run.stdout.splitlines():
    if line.startswith("{"):
        event = json.loads(line)
        if event.get("topic") == "order.paid":
            keys.append(event["key"])
expected = [f"order-{n}" for n in range(1, len(keys) + 1)]
if len(keys) < 3:
    fail(f"{len(keys)} events printed, expected at least 3")
if keys != expected:
    fail(f"events printed as {keys}, expected {expected} (each once, in commit order)")
total = re.search(r"^TOTAL\s+(\d+)\s", run.stdout, re.MULTILINE)
if not total or total.group(1) != "0":
    fail("`outbox-relay status` did not report TOTAL 0 pending")
print(f"ok: quickstart printed {len(keys)} events, each once and in order, and status reports 0 pending")
