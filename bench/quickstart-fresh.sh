#!/usr/bin/env bash
# Times the README's first command on a fresh machine, as near as this one can get: a Debian
# bookworm minbase root filesystem (debootstrap; the one tests/image/check.sh keeps, if there),
# entered with chroot, with this machine's apt sources; a clone of HEAD in it. Prints how long
# `scripts/install-deps.sh --quickstart` took, then `scripts/quickstart.sh` (its install step is
# then a no-op), then both. Needs root and mount namespaces; deletes the root at the end.
#   bench/quickstart-fresh.sh [DIR]   (default: a temp dir)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base=${OUTBOX_IMAGE_CACHE:-$HOME/.cache/outbox-relay/image}/bookworm-minbase.tar
fresh=${1:-$(mktemp -d /tmp/outbox-fresh.XXXXXX)}
cleanup() {
  for m in proc sys dev; do umount -R "$fresh/$m" 2> /dev/null || true; done
  rm -rf "$fresh"
}
trap cleanup EXIT
mkdir -p "$fresh"
if [ -f "$base" ]; then
  tar -xf "$base" -C "$fresh"
else
  debootstrap --variant=minbase bookworm "$fresh" > "$fresh.debootstrap.log" 2>&1
fi
cp /etc/resolv.conf "$fresh/etc/"
cp -r /etc/apt/sources.list.d/. "$fresh/etc/apt/sources.list.d/" 2> /dev/null || true
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$fresh/etc/apt/"
mount -t proc proc "$fresh/proc"
mount --rbind /dev "$fresh/dev"
mount --rbind /sys "$fresh/sys"
git clone -q "$root" "$fresh/root/outbox-relay"
echo "[quickstart-fresh] $(git -C "$root" log --oneline -1)" >&2
# shellcheck disable=SC2016
chroot "$fresh" /bin/bash -c '
  cd /root/outbox-relay
  export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  s=$(date +%s%N)
  scripts/install-deps.sh --quickstart > /tmp/install-deps.log 2>&1
  d=$(date +%s%N)
  scripts/quickstart.sh
  e=$(date +%s%N)
  echo "[quickstart-fresh] install-deps --quickstart: $(( (d - s) / 1000000 )) ms; quickstart.sh: $(( (e - d) / 1000000 )) ms; in all: $(( (e - s) / 1000000 )) ms" >&2'
