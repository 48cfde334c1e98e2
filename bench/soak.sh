#!/usr/bin/env bash
# Scale over time (issue 11): backlog size, table history, a 30-minute soak (on_success mark +
# retention 2m, then delete) and a catch-up, on a throwaway PostgreSQL 15 cluster with fsync on:
#   bench/soak.sh [soak.py options]      e.g. --points 1,2 (a part), --soak-minutes 30 (default),
#                                        --soak-rate 8000 (default: 40 % of the relay's drain rate
#                                        here: the lower of the quiet drain and the drain beside
#                                        unpaced writers),
#                                        --relay-bin DIR/outbox-relay, --pg-settings none (PostgreSQL's
#                                        defaults instead of docs/performance.md's advice for high rates);
#                                        bench/soak.sh --help
# Builds outbox-relay (Release, in build-bench/ or $BENCH_BUILD_DIR) unless --relay-bin is given,
# installs python3-matplotlib for the plots (Debian package; as root) if it is missing, then runs
# bench/soak.py (method in its docstring) through bench/cost-run.sh: prints the table of points
# 1-4 with the targets, writes bench/out/soak-<time>.json and the plots bench/figures/soak-mark.png
# and bench/figures/soak-delete.png. Takes about 85 minutes with the defaults (the two 30-minute
# soaks are most of it) and about 15 GB of scratch space in /tmp (the history table, the sink
# files, WAL).
# Not part of .ci/run. Run it on a quiet machine: foreign load is reported, not subtracted.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BENCH_BUILD_DIR:-$root/build-bench}

own_bin=1
for a in "$@"; do
  case "$a" in --relay-bin|--relay-bin=*) own_bin=0 ;; -h|--help) own_bin=0 ;; esac
done
if [ "$own_bin" = 1 ]; then
  echo "[soak] building outbox-relay (Release) in $build" >&2
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
    || { cat "$build/bench-cmake.log" >&2; exit 1; }
  ninja -C "$build" -j2 outbox-relay >&2
fi

# The plots: matplotlib from Debian's package, with the system's Python.
BENCH_PYTHON=python3
if /usr/bin/python3 -c 'import matplotlib' 2> /dev/null; then
  BENCH_PYTHON=/usr/bin/python3
elif [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "[soak] installing python3-matplotlib (for the plots)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib > /dev/null && BENCH_PYTHON=/usr/bin/python3
else
  echo "[soak] python3-matplotlib missing and not root: no plots (apt-get install python3-matplotlib)" >&2
fi
export BENCH_PYTHON
exec "$root/bench/cost-run.sh" soak "$@"
