#!/usr/bin/env bash
# Style kept by tools (run by scripts/test.sh, so by .ci/run):
#   scripts/check-style.sh format          clang-format --dry-run -Werror over every C++ file, the
#                                          120-column limit, final newlines, no trailing blanks
#   scripts/check-style.sh tidy BUILD_DIR  clang-tidy (.clang-tidy) over the relay/src files that
#                                          the last commit changed (a .hpp brings its .cpp), with
#                                          BUILD_DIR's compile_commands.json
#   scripts/check-style.sh tidy BUILD_DIR --all   the same over every file of relay/src (4 min 26 s
#                                          on the 2-core VM with 2 jobs, so CI runs the changed files)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
columns=120

check_format() {
  local failed=0
  mapfile -t cxx < <(git ls-files '*.cpp' '*.hpp' '*.hpp.in')
  if ! clang-format --dry-run -Werror "${cxx[@]}"; then
    echo "check-style: run clang-format -i on the files above (.clang-format)" >&2
    failed=1
  fi
  # clang-format leaves a string literal or a URL in a comment whole, so the limit is checked too.
  if awk -v n="$columns" 'length($0) > n { print FILENAME ":" FNR ": " length($0) " columns"; bad = 1 }
                          END { exit bad }' "${cxx[@]}"; then :; else
    echo "check-style: the lines above are over $columns columns" >&2
    failed=1
  fi
  # .editorconfig: every text file ends with a newline and no line ends in blanks (Markdown may,
  # for a hard line break).
  mapfile -t text < <(git ls-files | grep -Ev '\.(png|jar|gz)$')
  for f in "${text[@]}"; do
    [ -s "$f" ] || continue
    if [ "$(tail -c1 "$f" | od -An -c | tr -d ' ')" != '\n' ]; then
      echo "$f: no newline at the end" >&2
      failed=1
    fi
  done
  if grep -nE '[[:blank:]]+$' $(printf '%s\n' "${text[@]}" | grep -v '\.md$') >&2; then
    echo "check-style: the lines above end in blanks" >&2
    failed=1
  fi
  return $failed
}

check_tidy() {
  local build=${1:?usage: check-style.sh tidy BUILD_DIR [--all]}
  local scope=${2:-}
  [ -f "$build/compile_commands.json" ] || { echo "check-style: no $build/compile_commands.json" >&2; return 1; }
  local files=()
  if [ "$scope" = --all ]; then
    mapfile -t files < <(git ls-files 'relay/src/*.cpp')
  else
    local f
    while read -r f; do
      case "$f" in
        relay/src/*.cpp) [ -f "$f" ] && files+=("$f") ;;
        relay/src/*.hpp) [ -f "${f%.hpp}.cpp" ] && files+=("${f%.hpp}.cpp") ;;
      esac
    done < <(git diff --name-only HEAD^1 HEAD 2> /dev/null || git ls-files 'relay/src/*.cpp')
    mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u | grep .)
  fi
  if [ ${#files[@]} -eq 0 ]; then
    echo "check-style: the last commit changed no file of relay/src; clang-tidy has nothing to check"
    return 0
  fi
  echo "check-style: clang-tidy over ${#files[@]} file(s) of relay/src"
  printf '%s\n' "${files[@]}" | xargs -P "${TIDY_JOBS:-2}" -n 1 clang-tidy -quiet -p "$build"
}

case "${1:-}" in
  format) check_format ;;
  tidy) shift; check_tidy "$@" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
