#!/bin/sh
# Turns a Debian-style pool into a signed apt repository, as an enterprise
# mirror serves it: per-component Packages indexes, a Release file with
# checksums, and both InRelease (clear-signed) and Release.gpg (detached).
#
#   build-apt-repo.sh <repo-root> <suite> <gnupg-home> <key-id>
set -eu
root=$1 suite=$2 gnupghome=$3 keyid=$4
components="main contrib non-free non-free-firmware"
cd "$root"
rm -rf "dists/$suite"
for comp in $components; do
  dir="dists/$suite/$comp/binary-amd64"
  mkdir -p "$dir" "pool/$comp"
  apt-ftparchive packages "pool/$comp" > "$dir/Packages"
  gzip -9nkf "$dir/Packages"
done
apt-ftparchive \
  -o APT::FTPArchive::Release::Origin=gpufleet-lab \
  -o APT::FTPArchive::Release::Label=gpufleet-lab \
  -o APT::FTPArchive::Release::Suite="$suite" \
  -o APT::FTPArchive::Release::Codename="$suite" \
  -o APT::FTPArchive::Release::Architectures=amd64 \
  -o APT::FTPArchive::Release::Components="$components" \
  release "dists/$suite" > "/tmp/Release.$$"
mv "/tmp/Release.$$" "dists/$suite/Release"
gpg --homedir "$gnupghome" --batch --yes --local-user "$keyid" \
  --clearsign -o "dists/$suite/InRelease" "dists/$suite/Release"
gpg --homedir "$gnupghome" --batch --yes --local-user "$keyid" \
  --armor --detach-sign -o "dists/$suite/Release.gpg" "dists/$suite/Release"
echo "build-apt-repo: $(find pool -name '*.deb' | wc -l) packages signed by $keyid"
