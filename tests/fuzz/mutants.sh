#!/usr/bin/env bash
# Shows that the fuzzer can fail: builds the relay with one of the seven holes of issue 42 put back
# (a mutant: a few lines of the source or of schema/010 undone, the schema being compiled into the
# binary), the kafka sink's rule 4 taken out (kafka-rule4: a key's events of one batch sent to
# several topics, which Kafka does not order against each other; run with --sinks kafka), or the
# webhook sink's split of a refused request taken out (webhook-split: a 4xx to a request of several
# events dead-letters them all; run with --sinks webhook --events-per-request 50), and runs
# tests/fuzz/fuzz.py against it, which must report a violation.
#
#   tests/fuzz/mutants.sh HOLE [fuzz.py options]     HOLE: one of the names below, or all
#
# Each mutant is built from the committed tree (git archive HEAD) in /tmp/outbox-mutant-HOLE, with
# the compiler cache of scripts/build.sh (the flags of scripts/test.sh, so mostly cache hits). Prints, per hole, whether the
# fuzzer caught it and after how many seconds; exits 1 if one was not caught.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
hole=${1:?usage: mutants.sh HOLE|all [fuzz.py options]}
shift
holes=(cache fastpath locked database prepared restart longkey kafka-rule4 webhook-split)
python=${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python

# Replaces $2 by $3 in file $1 (fixed strings); fails if $2 is not there (the mutant would be void).
swap() {
  python3 - "$@" << 'EOF'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if old not in text:
    sys.exit(f"mutants.sh: {path} no longer holds {old!r}: update the mutant")
open(path, "w").write(text.replace(old, new))
EOF
}

mutate() {
  local dir=$1 name=$2
  case "$name" in
    cache)  # 1: a reading applies whatever the sequence's cache
      swap "$dir/relay/src/postgres/lane_bounds.cpp" "if (reading.sequence_cache > 1) {" "if (false) {" ;;
    fastpath)  # 2: a fastpath call or a background worker read as complete
      swap "$dir/schema/010_exact_readings.sql" "WHEN a.client IS DISTINCT FROM true THEN false" \
        "WHEN a.client IS NULL THEN false"
      swap "$dir/schema/010_exact_readings.sql" "WHEN a.state = 'active' THEN" \
        "WHEN a.state IN ('active', 'fastpath function call') THEN" ;;
    locked)  # 3: a row another transaction locked is skipped, its key's later events go first
      for f in "$dir/relay/src/postgres/claim_protocol.cpp" "$dir/schema/010_exact_readings.sql"; do
        swap "$f" "WHERE NOT EXISTS (SELECT 1 FROM stop AS x WHERE x.lane = k.lane AND x.first < k.id)" \
          "WHERE true OR NOT EXISTS (SELECT 1 FROM stop AS x WHERE x.lane = k.lane AND x.first < k.id)"
        swap "$f" "CASE WHEN NOT EXISTS (SELECT 1 FROM stop) THEN" "CASE WHEN true THEN"
      done ;;
    database)  # 4: relation locks matched without their database
      swap "$dir/schema/010_exact_readings.sql" "(k.locktype = 'relation' AND k.database = v_db AND" \
        "(k.locktype = 'relation' AND" ;;
    prepared)  # 5: a prepared transaction holds every lane
      swap "$dir/schema/010_exact_readings.sql" "WHEN h.pid IS NULL AND p.xid IS NOT NULL THEN true" \
        "WHEN h.pid IS NULL AND p.xid IS NOT NULL THEN false" ;;
    restart)  # 6: a sequence set back is not noticed
      swap "$dir/relay/src/postgres/lane_bounds.cpp" "  if (last_id >= top) return false;" \
        "  if (last_id >= top || top >= 0) return false;"
      swap "$dir/schema/010_exact_readings.sql" "      IF v_last < v_frontier THEN
        bound := -1;" "      IF false THEN
        bound := -1;" ;;
    longkey)  # 7: an outcome one row cannot take (once a long key's retry; now a poison key's) fails every
              # statement that carries it
      swap "$dir/relay/src/postgres/sqlstate.cpp" "    if (code == sqlstate) return true;" \
        "    if (code == sqlstate) return false;" ;;
    kafka-rule4)  # the kafka sink: a key's events of one batch to one topic only (submit()'s rule 4)
      swap "$dir/relay/src/sinks/kafka/kafka_sink.cpp" "      if (!config.exactly_once) {
        const auto [first, inserted] = topic_of_key.try_emplace(event.key, topic);" \
        "      if (false) {
        const auto [first, inserted] = topic_of_key.try_emplace(event.key, topic);" ;;
    webhook-split)  # the webhook sink: a refused request of several is not sent again event by event
      swap "$dir/relay/src/sinks/webhook/webhook_sink.cpp" \
        "if (outcome.kind == OutcomeKind::kPermanent && t.indices.size() > 1) {" "if (false) {" ;;
    *) echo "mutants.sh: unknown hole $name (one of: ${holes[*]})" >&2; exit 2 ;;
  esac
}

run_one() {
  local name=$1
  shift
  local dir=/tmp/outbox-mutant-$name
  rm -rf "$dir" && mkdir -p "$dir"
  git -C "$root" archive HEAD | tar -x -C "$dir"
  mutate "$dir" "$name"
  echo "== mutant $name: building"
  BUILD_DIR=$dir/build BUILD_TARGETS=outbox-relay "$dir/scripts/build.sh" -DOUTBOX_WERROR=ON > "$dir/build.log" 2>&1 \
    || { tail -20 "$dir/build.log"; exit 1; }
  echo "== mutant $name: fuzzing"
  local start rc=0 extra=()
  case "$name" in
    kafka-*) extra=(--sinks kafka) ;;
    webhook-*) extra=(--sinks webhook --events-per-request 50) ;;
  esac
  start=$(date +%s)
  "$python" "$root/tests/fuzz/fuzz.py" --relay-bin "$dir/build/bin/outbox-relay" "${extra[@]}" "$@" > "$dir/fuzz.log" 2>&1 || rc=$?
  local took=$(($(date +%s) - start))
  grep -E "^(seed|fuzz:|VIOLATION|violation)" "$dir/fuzz.log" | head -8 || true
  if [ "$rc" -ne 0 ]; then
    echo "mutant $name: caught in ${took} s (log: $dir/fuzz.log)"
  else
    echo "mutant $name: NOT caught in ${took} s (log: $dir/fuzz.log)"
    return 1
  fi
}

failed=0
if [ "$hole" = all ]; then
  for h in "${holes[@]}"; do run_one "$h" "$@" || failed=1; done
else
  run_one "$hole" "$@" || failed=1
fi
exit "$failed"
