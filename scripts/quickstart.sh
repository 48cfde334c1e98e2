#!/usr/bin/env bash
# See events flow: builds outbox-relay, starts a throwaway PostgreSQL, migrates, runs the relay
# with the stdout sink and a small writer that commits an order and its event in one transaction.
# Stops everything and deletes the throwaway cluster at the end (or on Ctrl-C).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
seconds=${QUICKSTART_SECONDS:-10}

# Only what this needs: the relay's build dependencies and PostgreSQL 15 (the test command
# installs the rest), and only the relay's binary (not the unit tests or the bench tool).
scripts/install-deps.sh --quickstart
# Its own build directory, optimised as `build/` is but with line tables only for debug info
# (-g1): compiling full debug info took a quarter of the quickstart's build time on a fresh
# machine, and a stack trace still names files and lines.
BUILD_DIR=$here/build-quickstart BUILD_TARGETS=outbox-relay scripts/build.sh \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
relay=$here/build-quickstart/bin/outbox-relay

work=$(mktemp -d /tmp/outbox-quickstart.XXXXXX)
chmod 755 "$work"
relay_pid=""
cleanup() {
  [ -n "$relay_pid" ] && kill -TERM "$relay_pid" 2> /dev/null && wait "$relay_pid" 2> /dev/null || true
  scripts/pg-cluster.sh stop "$work/pg"
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting a throwaway PostgreSQL in $work/pg"
DATABASE_URL=$(scripts/pg-cluster.sh start "$work/pg")
export DATABASE_URL  # the relay reads it; it never appears on a command line or in a log

echo "== outbox-relay migrate"
"$relay" migrate
psql -q "$DATABASE_URL" -c "CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)"

cat > "$work/relay.yaml" <<'YAML'
relay:
  sweep_interval: 30s
sinks:
  - name: console
    type: stdout
YAML
echo "== outbox-relay run (events below are the relay's stdout; its JSON logs go to $work/relay.log)"
"$relay" run --config "$work/relay.yaml" 2> "$work/relay.log" &
relay_pid=$!

echo "== writer: one order and its event per transaction, for ${seconds}s"
end=$((SECONDS + seconds))
n=0
while [ $SECONDS -lt $end ]; do
  n=$((n + 1))
  psql -q "$DATABASE_URL" > /dev/null <<SQL
BEGIN;
INSERT INTO orders (id, status) VALUES ($n, 'paid');
INSERT INTO outbox_events (topic, aggregate_id, payload)
VALUES ('order.paid', 'order-$n', jsonb_build_object('order_id', $n, 'status', 'paid'));
COMMIT;
SQL
  sleep 0.5
done
sleep 1
echo "== outbox-relay status"
"$relay" status
