#!/usr/bin/env bash
# Builds the Dockerfile without a Docker daemon and runs the image, as an operator would:
#   - the debian:bookworm and debian:bookworm-slim bases are made locally with debootstrap
#     (root filesystem imported with `buildah from scratch` + copy + commit, tagged with both names);
#   - `buildah bud --isolation chroot --pull=never` (storage driver vfs) builds the Dockerfile as is;
#   - inside the image (`buildah run`): `outbox-relay --version`; the image's ENTRYPOINT + CMD run the
#     relay as uid 10001 against a throwaway PostgreSQL on the host network, delivering events to a
#     file sink in a mounted directory (every event arrives, exactly once); the HEALTHCHECK's own
#     command returns 0 while it runs;
#   - the runtime stage adds at most OUTBOX_IMAGE_MAX_ADDED_MB (60) MB to its base image.
#
#   tests/image/check.sh
#
# Prints "ok: ..." per check, "FAIL: ..." and exits 1 on a failure. Prints "skip: ..." and exits 0
# only where buildah cannot run at all (not root and no passwordless sudo, or no mount namespaces).
#
# Everything reusable is cached outside the repository, in OUTBOX_IMAGE_CACHE
# (default ~/.cache/outbox-relay/image), so a second run is fast:
#   bookworm-minbase.tar  the debootstrap root filesystem (made again when older than 7 days)
#   storage/ run/         buildah's image store: the bases and the build's cached layers
#   tmp/                  buildah's temporary files, including the builder's compiler cache
#                         (RUN --mount=type=cache), so a changed source recompiles only what changed
# The run phase (Postgres, relay, health check) happens in a private network namespace, so the
# image's fixed port 9187 cannot collide with anything else on the machine.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
self=$root/tests/image/check.sh
cache=${OUTBOX_IMAGE_CACHE:-$HOME/.cache/outbox-relay/image}
mirror=${OUTBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
max_added_mb=${OUTBOX_IMAGE_MAX_ADDED_MB:-60}
image=localhost/outbox-relay:check
events=${OUTBOX_IMAGE_EVENTS:-500}

ok() { echo "ok: $*"; }
skip() {
  echo "skip: $*"
  exit 0
}
die() {
  echo "FAIL: $1"
  [ -n "${2:-}" ] && [ -f "$2" ] && tail -n "${3:-40}" "$2" | sed 's/^/    /'
  exit 1
}

# ---------------------------------------------------------------------------------------------
# The run phase: re-executed by the build phase inside `unshare --net` (loopback only).
# Arguments: the working container's name, a scratch directory the postgres user can enter.
if [ "${1:-}" = "--run-phase" ]; then
  ctr=$2
  work=$3
  B=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)
  ip link set lo up || die "cannot bring up the loopback interface in the private network namespace"

  url=$(PG_FAST=1 "$root/scripts/pg-cluster.sh" start "$work/pg") || die "PostgreSQL did not start" "$work/pg/server.log"
  relay_pid=""
  cleanup_run() {
    [ -n "$relay_pid" ] && kill -TERM "$relay_pid" 2> /dev/null && wait "$relay_pid" 2> /dev/null
    "$root/scripts/pg-cluster.sh" stop "$work/pg"
  }
  trap cleanup_run EXIT
  psql=(/usr/lib/postgresql/15/bin/psql -X -q -v ON_ERROR_STOP=1 -At "$url")

  # The schema, with the image's own binary.
  "${B[@]}" run --env DATABASE_URL="$url" "$ctr" -- outbox-relay migrate > "$work/migrate.log" 2>&1 \
    || die "outbox-relay migrate inside the image" "$work/migrate.log"
  ok "outbox-relay migrate inside the image: $(tail -n1 "$work/migrate.log")"

  "${psql[@]}" -c "INSERT INTO outbox_events (topic, aggregate_id, payload)
                   SELECT 'image.check', 'key-' || (g % 7), jsonb_build_object('n', g)
                   FROM generate_series(1, $events) AS g" > "$work/insert.log" 2>&1 \
    || die "inserting $events events" "$work/insert.log"

  # The config lives where the image's CMD expects it; the file sink writes to a mounted directory
  # that only the image's user (10001) may write to. The URL comes from the environment.
  mkdir -p "$work/out"
  chown 10001:10001 "$work/out"
  chmod 700 "$work/out"
  cat > "$work/config.yaml" << 'YAML'
http: {listen: "127.0.0.1:9187"}
sinks: [{name: out, type: file, path: /out/events.jsonl}]
YAML
  chmod 644 "$work/config.yaml"

  # Exactly the image's ENTRYPOINT + CMD.
  mapfile -t command < <("${B[@]}" inspect --type image \
    --format '{{range .Docker.Config.Entrypoint}}{{println .}}{{end}}{{range .Docker.Config.Cmd}}{{println .}}{{end}}' "$image")
  [ "${#command[@]}" -ge 2 ] || die "the image has no ENTRYPOINT/CMD"
  "${B[@]}" run --env DATABASE_URL="$url" --volume "$work/config.yaml:/etc/outbox-relay/config.yaml:ro" \
    --volume "$work/out:/out" "$ctr" -- "${command[@]}" > "$work/relay.log" 2>&1 &
  relay_pid=$!

  # Every event arrives.
  delivered=0
  for _ in $(seq 1 600); do
    delivered=$(cat "$work/out/events.jsonl" 2> /dev/null | wc -l)
    [ "$delivered" -ge "$events" ] && break
    kill -0 "$relay_pid" 2> /dev/null || die "the relay in the image exited early" "$work/relay.log"
    sleep 0.1
  done
  pending=$("${psql[@]}" -c "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")
  distinct=$(python3 -c 'import json, sys; print(len({json.loads(l)["id"] for l in open(sys.argv[1])}))' \
    "$work/out/events.jsonl" 2> /dev/null)
  if [ "$delivered" = "$events" ] && [ "$distinct" = "$events" ] && [ "$pending" = 0 ]; then
    ok "the relay in the image (${command[*]}) delivered $events of $events events to the mounted file sink, 0 pending"
  else
    echo "delivered lines: $delivered, distinct ids: $distinct, pending rows: $pending" >> "$work/relay.log"
    die "the relay in the image delivered $delivered lines ($distinct distinct ids) of $events events, $pending pending" "$work/relay.log"
  fi

  # The relay process itself runs as the image's user.
  relay_proc=""
  descendants() {
    local child
    for child in $(pgrep -P "$1"); do
      echo "$child"
      descendants "$child"
    done
  }
  for p in $(descendants "$relay_pid"); do
    # Seen from the host, a chrooted process's executable has the container's root as a prefix.
    case "$(readlink "/proc/$p/exe" 2> /dev/null)" in */usr/local/bin/outbox-relay) relay_proc=$p ;; esac
  done
  [ -n "$relay_proc" ] || die "cannot find the relay process under buildah run (pid $relay_pid)"
  uids=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$relay_proc/status")
  gids=$(awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$relay_proc/status")
  [ "$uids" = "10001 10001 10001 10001" ] && [ "$gids" = "10001 10001 10001 10001" ] \
    || die "the relay process runs as uid/gid '$uids' / '$gids', expected 10001"
  ok "the relay process runs as uid 10001, gid 10001"
  owner=$(stat -c %u:%g "$work/out/events.jsonl")
  [ "$owner" = 10001:10001 ] || die "the sink file is owned by $owner, expected 10001:10001"

  # The HEALTHCHECK's own command, as the image declares it.
  mapfile -t health < <("${B[@]}" inspect --type image \
    --format '{{if .Docker.Config.Healthcheck}}{{range .Docker.Config.Healthcheck.Test}}{{println .}}{{end}}{{end}}' "$image")
  [ "${#health[@]}" -ge 2 ] || die "the image has no HEALTHCHECK (built without --format docker?)"
  if [ "${health[0]}" = CMD-SHELL ]; then probe=(/bin/sh -c "${health[1]}"); else probe=("${health[@]:1}"); fi
  "${B[@]}" run "$ctr" -- "${probe[@]}" > "$work/health.log" 2>&1 \
    || die "the HEALTHCHECK command (${probe[*]}) failed while the relay runs" "$work/health.log"
  ok "the HEALTHCHECK command returns 0 while the relay runs: ${probe[*]}"

  # SIGTERM to buildah run reaches the relay: a clean exit 0.
  kill -TERM "$relay_proc"
  wait "$relay_pid"
  code=$?
  relay_pid=""
  [ "$code" = 0 ] || die "the relay in the image exited $code after SIGTERM" "$work/relay.log"
  ok "the relay in the image exits 0 on SIGTERM"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# The build phase.

if [ "$(id -u)" != 0 ]; then
  # debootstrap and buildah's chroot isolation with vfs storage need root.
  if command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
    exec sudo -n OUTBOX_IMAGE_CACHE="$cache" OUTBOX_DEBIAN_MIRROR="$mirror" OUTBOX_IMAGE_MAX_ADDED_MB="$max_added_mb" \
      OUTBOX_IMAGE_EVENTS="$events" "$self" "$@"
  fi
  skip "the container image: buildah cannot run here (needs root or passwordless sudo for debootstrap and chroot isolation)"
fi
for tool in buildah debootstrap unshare ip; do
  command -v "$tool" > /dev/null || die "$tool is not installed (scripts/install-deps.sh installs it)"
done
mkdir -p "$cache/tmp"
# The run phase's files (Postgres cluster, config, sink directory) go where the postgres user can
# reach them, unlike a cache under root's home.
run_dir=$(mktemp -d /tmp/outbox-image-check.XXXXXX)
chmod 755 "$run_dir"
exec 9> "$cache/lock"
flock 9  # one run at a time per cache
export TMPDIR=$cache/tmp
# chroot isolation for `buildah run` too (the default, oci, needs a runtime such as runc).
export BUILDAH_ISOLATION=chroot
B=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)
work=$(mktemp -d "$cache/tmp/check.XXXXXX")
containers=()
cleanup() {
  local c
  for c in "${containers[@]}"; do "${B[@]}" rm "$c" > /dev/null 2>&1; done
  rm -rf "$work" "$run_dir"
}
trap cleanup EXIT

# Can buildah run at all? A working container must mount, and a chroot with its own mount
# namespace must start. Anything else that fails later is a failure, not a skip.
if ! unshare --mount --pid --fork true 2> "$work/unshare.log"; then
  skip "the container image: no mount/pid namespaces here, buildah's chroot isolation cannot run ($(head -c 200 "$work/unshare.log"))"
fi
if ! probe=$("${B[@]}" from scratch 2> "$work/probe.log") || ! "${B[@]}" mount "$probe" > /dev/null 2>> "$work/probe.log"; then
  skip "the container image: buildah cannot create and mount a container here ($(head -c 300 "$work/probe.log"))"
fi
"${B[@]}" rm "$probe" > /dev/null

# --- the bases: debian:bookworm and debian:bookworm-slim from one debootstrap root filesystem ---
start=$(date +%s)
rootfs_tar=$cache/bookworm-minbase.tar
if [ ! -s "$rootfs_tar" ] || [ -n "$(find "$rootfs_tar" -mtime +7)" ]; then
  rm -rf "$cache/rootfs.new"
  debootstrap --variant=minbase bookworm "$cache/rootfs.new" "$mirror" > "$work/debootstrap.log" 2>&1 \
    || die "debootstrap bookworm from $mirror" "$work/debootstrap.log"
  r=$cache/rootfs.new
  # What the official images add (debuerreotype): all three suites, and apt settings that keep
  # package caches and translations out of image layers.
  rm -f "$r/etc/apt/sources.list"
  cat > "$r/etc/apt/sources.list.d/debian.sources" << EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${OUTBOX_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat > "$r/etc/apt/apt.conf.d/docker-clean" << 'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' > "$r/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' > "$r/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' > "$r/etc/apt/apt.conf.d/docker-autoremove-suggests"
  echo 'force-unsafe-io' > "$r/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
  # debootstrap installs the release; the official images also carry the updates since.
  chroot "$r" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq' \
    > "$work/upgrade.log" 2>&1 || die "apt-get upgrade in the new root filesystem" "$work/upgrade.log"
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* "$r"/var/log/*.log
  : > "$r/etc/resolv.conf"
  printf 'bookworm\n' > "$r/etc/hostname"
  tar -C "$r" --numeric-owner -cf "$rootfs_tar.new" . || die "packing the root filesystem"
  mv "$rootfs_tar.new" "$rootfs_tar"
  rm -rf "$r"
  ok "debootstrap bookworm (minbase) into $rootfs_tar in $(($(date +%s) - start)) s"
fi
stamp=$(stat -c %Y "$rootfs_tar")
for variant in bookworm bookworm-slim; do
  name=docker.io/library/debian:$variant
  if [ "$(cat "$cache/$variant.stamp" 2> /dev/null)" = "$stamp" ] && "${B[@]}" inspect --type image "$name" > /dev/null 2>&1; then
    continue
  fi
  c=$("${B[@]}" from scratch) || die "buildah from scratch"
  containers+=("$c")
  mnt=$("${B[@]}" mount "$c") || die "buildah mount"
  tar -C "$mnt" --numeric-owner -xpf "$rootfs_tar" || die "unpacking the root filesystem into the $variant container"
  if [ "$variant" = bookworm-slim ]; then
    # As debuerreotype's slimify: no documentation, manuals or translations, now or later.
    cat > "$mnt/etc/dpkg/dpkg.cfg.d/docker" << 'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
    find "$mnt/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$mnt/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$mnt"/usr/share/{groff,info,linda,locale,man}/* "$mnt"/usr/share/lintian/overrides/*
  fi
  "${B[@]}" config --cmd '["bash"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c" \
    || die "buildah config $variant"
  "${B[@]}" commit --rm -q "$c" "$name" > /dev/null || die "buildah commit $name"
  containers=("${containers[@]/$c/}")
  echo "$stamp" > "$cache/$variant.stamp"
  ok "base image $name imported from the debootstrap root filesystem"
done

# --- the image: the Dockerfile as it is, as `docker build` would build it ---
start=$(date +%s)
# --format docker: the OCI format has no HEALTHCHECK. Two compile jobs: the machine is shared.
"${B[@]}" bud --isolation chroot --pull=never --layers --format docker --build-arg BUILD_JOBS="${OUTBOX_IMAGE_JOBS:-2}" \
  -t "$image" -f "$root/Dockerfile" "$root" 2>&1 | while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done > "$work/build.log"
status=${PIPESTATUS[0]}
cp "$work/build.log" "$cache/last-build.log"  # timestamped, kept for a look after the run
[ "$status" = 0 ] || die "buildah bud (log: tail of the build output)" "$work/build.log" 60
ok "built $image from the Dockerfile in $(($(date +%s) - start)) s"

# Cached layers of earlier builds that this build did not use are garbage (vfs copies the whole
# file system per layer): keep only the layers this build used or made, and named images.
# (buildah prints ids shortened to 11 characters or in full.)
keep=$(grep -Eo -- ' --> (Using cache )?[0-9a-f]{11,64}$' "$work/build.log" | grep -Eo '[0-9a-f]{11,64}$' | cut -c1-11)
for id in $("${B[@]}" images --all --noheading --no-trunc --format '{{.ID}} {{.Name}}' | awk '$2 == "<none>" { print $1 }'); do
  id=${id#sha256:}
  grep -qx "${id:0:11}" <<< "$keep" || "${B[@]}" rmi "$id" > /dev/null 2>&1 || true
done

# --- size: the runtime stage's addition to its base ---
# In bytes, from buildah's figure (the uncompressed layers, as `docker images` shows it: 3 digits, 1000-based units).
size_of() {
  "${B[@]}" images --json "$1" | python3 -c 'import json, sys
number, unit = json.load(sys.stdin)[0]["size"].split()
print(round(float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]))'
}
image_bytes=$(size_of "$image")
base_bytes=$(size_of docker.io/library/debian:bookworm-slim)
added=$((image_bytes - base_bytes))
mb() { python3 -c 'import sys; print(f"{int(sys.argv[1]) / 1e6:.1f}")' "$1"; }
sizes="image $(mb "$image_bytes") MB = debian:bookworm-slim $(mb "$base_bytes") MB + $(mb "$added") MB"
if [ "$added" -le $((max_added_mb * 1000000)) ]; then
  ok "size: $sizes (at most $max_added_mb MB added)"
else
  c=$("${B[@]}" from --pull=never "$image") && containers+=("$c")
  "${B[@]}" run "$c" -- sh -c 'du -xk / 2> /dev/null | sort -n | tail -n 25' > "$work/du.log" 2>&1
  die "size: $sizes, more than $max_added_mb MB added (largest directories in kB:)" "$work/du.log" 25
fi

# --- inside the image ---
ctr=$("${B[@]}" from --pull=never "$image") || die "buildah from $image"
containers+=("$ctr")
version=$(sed -nE 's/^project\(outbox_relay VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
got=$("${B[@]}" run "$ctr" -- outbox-relay --version 2>&1)
code=$?
[ "$got" = "outbox-relay $version" ] \
  || die "outbox-relay --version in the image printed '$got' (exit $code), expected 'outbox-relay $version'"
ok "outbox-relay --version in the image: $got"
got=$("${B[@]}" run "$ctr" -- sh -c 'echo "$(id -u):$(id -g)"' 2>&1)
[ "$got" = 10001:10001 ] || die "the image's user is '$got', expected 10001:10001"
ok "the image's user is 10001:10001"

unshare --net --fork "$self" --run-phase "$ctr" "$run_dir" || exit 1
echo "all image checks passed"
