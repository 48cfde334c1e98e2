#!/usr/bin/env bash
# Installs the writer examples' pinned dependencies and builds them, outside the repository where
# the toolchain allows: Python venv, Go binary, Java classes and jars, Rust binary under
# ${OUTBOX_EXAMPLES_CACHE:-~/.cache/outbox-relay/examples}; Node's node_modules beside
# package.json (git-ignored). Called by scripts/install-deps.sh; idempotent and quick when nothing
# changed. Needs python3, go, node/npm, java 17 + mvn, cargo.
#
#   examples/install.sh                 install and build every example
#   examples/install.sh --if-available  the same, or only a note when a toolchain is missing
#                                       (scripts/install-deps.sh: the quickstart needs none of them)
#   examples/install.sh --print         print the command that runs each example (name<TAB>command)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${OUTBOX_EXAMPLES_CACHE:-$HOME/.cache/outbox-relay/examples}

if [ "${1:-}" = "--print" ]; then
  printf 'python\t%s\n' "$cache/python-venv/bin/python $here/python/writer.py"
  printf 'go\t%s\n' "$cache/bin/go-writer"
  printf 'node\t%s\n' "node $here/node/writer.js"
  printf 'java\t%s\n' "java -cp $cache/java/classes:$cache/java/lib/* example.outbox.Writer"
  printf 'rust\t%s\n' "$cache/rust-target/release/outbox-writer-example"
  exit 0
fi

step() { echo "examples/install.sh: $*" >&2; }
for tool in python3 go npm java mvn cargo; do
  if ! command -v "$tool" > /dev/null; then
    step "$tool not found: the examples need python3, go, node/npm, java 17 + mvn and cargo"
    [ "${1:-}" = "--if-available" ] && exit 0
    exit 1
  fi
done
mkdir -p "$cache/bin"

# A stamp per example holds a hash of its sources: it is rebuilt when its output ($2) is missing or
# its sources differ from those of the last build (also those of another checkout sharing the cache).
sources_hash() {
  (cd "$here/$1" && find . -type f -not -path './node_modules/*' -not -path './target/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}
# Node's node_modules lives in the checkout, so its stamp is per checkout.
stamp() {
  if [ "$1" = node ]; then echo "$cache/.node-$(printf %s "$here" | sha256sum | cut -c1-12).stamp"
  else echo "$cache/.$1.stamp"; fi
}
fresh() {
  [ -e "$2" ] && [ "$(cat "$(stamp "$1")" 2> /dev/null)" = "$(sources_hash "$1")" ]
}
done_() { sources_hash "$1" > "$(stamp "$1")"; }

if ! fresh python "$cache/python-venv/bin/python"; then
  step "python: venv with psycopg 3"
  [ -x "$cache/python-venv/bin/python" ] || python3 -m venv "$cache/python-venv"
  "$cache/python-venv/bin/pip" install -q --disable-pip-version-check -r "$here/python/requirements.txt"
  done_ python
fi

if ! fresh go "$cache/bin/go-writer"; then
  step "go: pgx v5 (go.sum), build"
  (cd "$here/go" && go mod download && go build -trimpath -o "$cache/bin/go-writer" .)
  done_ go
fi

if ! fresh node "$here/node/node_modules/pg"; then
  step "node: npm ci (package-lock.json)"
  (cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)
  done_ node
fi

if ! fresh java "$cache/java/classes"; then
  step "java: mvn compile + pgjdbc"
  rm -rf "$cache/java"
  # mvn -q still prints colour resets; its output is shown only when it fails.
  if ! mvn -B -q -Dstyle.color=never -f "$here/java/pom.xml" -DbuildDirectory="$cache/java" \
      compile dependency:copy-dependencies > "$cache/java-build.log" 2>&1; then
    cat "$cache/java-build.log" >&2
    exit 1
  fi
  done_ java
fi

if ! fresh rust "$cache/rust-target/release/outbox-writer-example"; then
  step "rust: cargo build --locked (Cargo.lock); the first build takes a few minutes"
  CARGO_TARGET_DIR="$cache/rust-target" cargo build -q --release --locked \
    --manifest-path "$here/rust/Cargo.toml"
  done_ rust
fi
