#!/usr/bin/env python3
"""Checks that every header of relay/src/core/ compiles alone with only outbox_core's include
paths (relay/src and nlohmann_json's) and pulls in nothing but the standard library (C++ and C,
kernel headers included), core/, log/ and nlohmann_json.

/usr/include is always on the compiler's path, so compiling is not enough: a core header could
include <pqxx/pqxx> and still compile. This script lists every header each core header pulls in
(g++ -H) and asks dpkg which package installed it; a header of any other package, or of another
folder of relay/src, fails the check, naming the core header, its include line and the file.

Exit status: 0 when every header is clean, 1 otherwise. Debian only (it asks dpkg)."""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "relay", "src")
ALLOWED_FOLDERS = [os.path.join(SRC, "core"), os.path.join(SRC, "log")]
# The C++ standard library and the compiler's own headers, the C library and the kernel's
# headers it includes, and the JSON type core/ uses.
ALLOWED_PACKAGES = re.compile(r"^(libstdc\+\+-\d+-dev|libgcc-\d+-dev|libc6-dev|linux-libc-dev|nlohmann-json3-dev)$")
RULE = "core/ may include only the standard library, core/, log/ and nlohmann_json"


def include_flags():
    flags = ["-I" + SRC]
    try:
        out = subprocess.run(["pkg-config", "--cflags-only-I", "nlohmann_json"], capture_output=True,
                             text=True, check=True).stdout
        flags += out.split()
    except (OSError, subprocess.CalledProcessError):
        pass  # Debian's nlohmann_json lives in /usr/include, which is always searched
    return flags


def included_files(header, flags):
    """[(depth, path)] of everything `#include "core/<header>"` pulls in (depth 1: the header)."""
    rel = os.path.relpath(header, SRC)
    proc = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-H", *flags, "-x", "c++", "-"],
                          input=f'#include "{rel}"\n', capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"core-headers: {rel} does not compile alone with outbox_core's include paths")
    files = []
    for line in proc.stderr.splitlines():
        m = re.match(r"^(\.+) (\S.*)$", line)
        if m:
            files.append((len(m.group(1)), os.path.normpath(m.group(2))))
    return files


def owners(paths):
    """{path: package} for the files dpkg knows; the others are missing."""
    found = {}
    if not paths:
        return found
    proc = subprocess.run(["dpkg-query", "-S", *sorted(paths)], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("diversion ") or ": " not in line:
            continue
        packages, path = line.split(": ", 1)
        found[path] = packages.split(", ")[0].split(":")[0]
    return found


def spelled(header, path):
    """The include line of `header` that names `path`, e.g. <pqxx/pqxx>."""
    with open(header) as f:
        for line in f:
            m = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
            if m and path.endswith("/" + m.group(2)):
                return ("<%s>" if m.group(1) == "<" else '"%s"') % m.group(2)
    return path


def main():
    flags = include_flags()
    headers = sorted(os.path.join(SRC, "core", h) for h in os.listdir(os.path.join(SRC, "core"))
                     if h.endswith(".hpp"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        pulled = dict(zip(headers, pool.map(lambda h: included_files(h, flags), headers)))
    outside = {p for files in pulled.values() for _, p in files
               if not any(p.startswith(d + os.sep) for d in ALLOWED_FOLDERS)}
    package_of = owners({p for p in outside if not p.startswith(SRC + os.sep)})

    def problem(path):
        if any(path.startswith(d + os.sep) for d in ALLOWED_FOLDERS):
            return None
        if path.startswith(SRC + os.sep):
            return "relay/src/" + os.path.relpath(path, SRC)
        package = package_of.get(path)
        if package is None:
            return path + " (from no Debian package)"
        return None if ALLOWED_PACKAGES.match(package) else f"{path} (from {package})"

    failures = 0
    for header, files in pulled.items():
        chain = []  # the include chain down to the current file
        for depth, path in files:
            del chain[depth - 1:]
            chain.append(path)
            if depth < 2:
                continue
            why = problem(path)
            if why is None or any(problem(p) for p in chain[1:-1]):
                continue  # clean, or inside a header reported already
            failures += 1
            direct = spelled(header, chain[1])
            via = "" if depth <= 3 else " via " + " -> ".join(os.path.basename(p) for p in chain[2:-1])
            print(f"core-headers: relay/src/core/{os.path.basename(header)}: #include {direct}{via} "
                  f"pulls in {why}: {RULE}", file=sys.stderr)
    if failures:
        print(f"core-headers: {failures} forbidden include(s) in relay/src/core/", file=sys.stderr)
        return 1
    print(f"core-headers: {len(headers)} headers of relay/src/core/ compile alone and include only "
          "the standard library, core/, log/ and nlohmann_json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
