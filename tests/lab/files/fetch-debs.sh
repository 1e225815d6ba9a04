#!/bin/sh
# Runs inside a throw-away container of the lab base image that still has a
# route out. Resolves the dependency closure of the packages named on the
# command line against Debian bookworm (as the lab nodes would install them:
# no recommends) and lays the .deb files out in a Debian-style pool under
# /out, keeping the archive component of each file (main, non-free, ...).
#
#   fetch-debs.sh <debian-url> <package>...
#
# With UPGRADE_SOURCE="<url> <suite>" and UPGRADE_PACKAGES="<package>..." in
# the environment it then adds that source and also fetches the newer
# versions it has of those packages (a later driver release beside the
# pinned one, for the driver-upgrade rehearsal).
#
# The word "@kernel-headers" among the packages stands for the headers of
# the current bookworm kernel ABI (linux-headers-<abi>-amd64); the ABI found
# is written to /out/kernel-release.
set -eu
url=$1; shift
cat > /etc/apt/sources.list <<SRC
deb $url bookworm main contrib non-free non-free-firmware
SRC
rm -f /etc/apt/sources.list.d/*
apt-get -qq update

kernel=$(apt-cache depends linux-headers-amd64 | sed -n 's/^ *Depends: linux-headers-\(.*-amd64\)$/\1/p' | head -n1)
[ -n "$kernel" ] || { echo "fetch-debs: cannot resolve the bookworm kernel ABI" >&2; exit 1; }

pkgs=""
for p in "$@"; do
  [ "$p" = "@kernel-headers" ] && p="linux-headers-$kernel"
  pkgs="$pkgs $p"
done

# shellcheck disable=SC2086
apt-get -qq install --no-install-recommends --print-uris -y $pkgs > /tmp/uris
# shellcheck disable=SC2086
apt-get -qq install --no-install-recommends --download-only -y $pkgs > /dev/null

copy_to_pool() {
  while read -r uri file _size _hash; do
    uri=$(echo "$uri" | tr -d "'")
    path=${uri#*/pool/}
    path=${path#updates/}  # debian-security's pool/updates/<component>/...
    mkdir -p "/out/pool/$(dirname "$path")"
    cp "/var/cache/apt/archives/$file" "/out/pool/$path"
  done < "$1"
}

mkdir -p /out
copy_to_pool /tmp/uris

if [ -n "${UPGRADE_SOURCE:-}" ]; then
  echo "deb $UPGRADE_SOURCE main contrib non-free non-free-firmware" >> /etc/apt/sources.list
  apt-get -qq update
  # shellcheck disable=SC2086
  apt-get -qq install --no-install-recommends --print-uris -y $UPGRADE_PACKAGES > /tmp/uris-upgrade
  # shellcheck disable=SC2086
  apt-get -qq install --no-install-recommends --download-only -y $UPGRADE_PACKAGES > /dev/null
  copy_to_pool /tmp/uris-upgrade
  echo "fetch-debs: $(wc -l < /tmp/uris-upgrade) newer packages from $UPGRADE_SOURCE"
fi
echo "$kernel" > /out/kernel-release
echo "fetch-debs: $(wc -l < /tmp/uris) packages for kernel $kernel"
