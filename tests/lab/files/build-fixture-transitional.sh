#!/bin/sh
# LAB FIXTURE: a driver build whose packages depend on another branch's, as
# Canonical's 535-server builds have done since R535's end of life (they are
# transitional to 580-server: libnvidia-extra-535-server 535.309.01-0ubuntu0.24.04.2
# depends on libnvidia-extra-580-server; issue 14, finding 1). Debian publishes
# no such build, so the lab makes one, in a repository of its own that says
# what it is: its own path on the mirror (/fixtures/transitional), its own
# suite (gpufleet-fixture-transitional), the lab's origin and key, and a
# version of the lab's own (535.261.03-1+gpufleetlab1: Debian's 535.261.03
# release with a lab revision). One package, nvidia-smi (the version package
# of the debian_nonfree source), with no files: play 1 reads its Depends and
# must refuse it before any change; nothing ever installs it.
#
#   build-fixture-transitional.sh <repo-root> <gnupg-home> <key-id>
set -eu
root=$1 gnupghome=$2 keyid=$3
suite=gpufleet-fixture-transitional
here=$(dirname "$0")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$root"
mkdir -p "$work/pkg/DEBIAN" "$root/pool/non-free/n/nvidia-smi"
cat > "$work/pkg/DEBIAN/control" <<'CONTROL'
Package: nvidia-smi
Version: 535.261.03-1+gpufleetlab1
Architecture: amd64
Maintainer: gpufleet lab <lab@gpufleet.invalid>
Section: non-free/utils
Priority: optional
Depends: libnvidia-compute-580 (>= 580.95.05)
Description: gpufleet lab fixture: a 535 build that pulls in branch 580
 Built by tests/lab/files/build-fixture-transitional.sh. It stands for a
 transitional driver build: its packages carry branch 535's names and
 depend on branch 580's. Not a Debian or NVIDIA package.
CONTROL
dpkg-deb --root-owner-group -Zgzip --build "$work/pkg" \
  "$root/pool/non-free/n/nvidia-smi/nvidia-smi_535.261.03-1+gpufleetlab1_amd64.deb" >/dev/null
sh "$here/build-apt-repo.sh" "$root" "$suite" "$gnupghome" "$keyid"
