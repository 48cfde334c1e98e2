#!/usr/bin/env bash
# Configures and builds outbox-relay into BUILD_DIR (default: build). Used by the README's
# commands, CI and the Dockerfile. Extra arguments go to cmake (e.g. -DOUTBOX_SANITIZE=ON).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${BUILD_DIR:-$here/build}
targets=${BUILD_TARGETS:-}
mkdir -p "$build_dir"
launcher=()
if command -v ccache > /dev/null; then
  # A compiler cache outside the repository: a fresh clone rebuilds from it in seconds.
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/outbox-relay/ccache}"
  export CCACHE_BASEDIR="$here"  # paths relative to the clone, so every clone shares the cache
  # Debug info names the build directory, so ccache keys -g objects on it by default: every fresh
  # clone missed (19 hits of 691 in CI). Leave it out of the key; a cached object's debug info may
  # then name another clone's directory, which nothing here reads.
  export CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$here" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "${launcher[@]}" "$@" > "$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log"; exit 1; }
# shellcheck disable=SC2086
ninja -C "$build_dir" -j "${BUILD_JOBS:-2}" $targets
