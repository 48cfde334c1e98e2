# Shared by the tests/ops check scripts (source it after setting tmp to a scratch directory):
# one "ok: ...", "skip: ..." or "FAIL: ..." line per check, a count of the failures, and `python`:
# the project's venv or python3, whichever has PyYAML (empty if neither).
python=""
for candidate in "${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python" python3; do
  if command -v "$candidate" > /dev/null && "$candidate" -c 'import yaml' 2> /dev/null; then
    python=$candidate
    break
  fi
done
failures=0
ok() { echo "ok: $*"; }
skip() { echo "skip: $*"; }
fail() {
  echo "FAIL: $1"
  [ -n "${2:-}" ] && sed 's/^/    /' "$2"
  failures=$((failures + 1))
}
# run NAME CMD...: ok when CMD exits 0 and prints nothing to stderr (warnings count as failures).
run() {
  local name=$1
  shift
  if "$@" > "$tmp/out" 2> "$tmp/err" && [ ! -s "$tmp/err" ]; then
    ok "$name"
  else
    cat "$tmp/err" >> "$tmp/out"
    fail "$name" "$tmp/out"
  fi
}
