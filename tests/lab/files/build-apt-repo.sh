#!/bin/sh
# Turns a Debian-style pool into a signed apt repository, as an enterprise
# mirror serves it: per-component Packages indexes, a Release file with
# checksums, and both InRelease (clear-signed) and Release.gpg (detached).
# With the suite "/" the repository is flat, as NVIDIA's CUDA repository is
# (`deb <url>/ /`): the .deb files, Packages and the Release files all in
# <repo-root> itself; the Release file's Label is then <label> (default
# gpufleet-lab).
#
#   build-apt-repo.sh <repo-root> <suite> <gnupg-home> <key-id> [<label>]
set -eu
root=$1 suite=$2 gnupghome=$3 keyid=$4 label=${5:-gpufleet-lab}
components="main contrib non-free non-free-firmware"
cd "$root"
if [ "$suite" = / ]; then
  dir=. release_dir=.
  apt-ftparchive packages . > Packages
  gzip -9nkf Packages
  set -- -o APT::FTPArchive::Release::Origin=gpufleet-lab -o APT::FTPArchive::Release::Label="$label" \
    -o APT::FTPArchive::Release::Architectures=amd64
else
  release_dir="dists/$suite"
  rm -rf "$release_dir"
  for comp in $components; do
    dir="dists/$suite/$comp/binary-amd64"
    mkdir -p "$dir" "pool/$comp"
    apt-ftparchive packages "pool/$comp" > "$dir/Packages"
    gzip -9nkf "$dir/Packages"
  done
  set -- -o APT::FTPArchive::Release::Origin=gpufleet-lab -o APT::FTPArchive::Release::Label="$label" \
    -o APT::FTPArchive::Release::Suite="$suite" -o APT::FTPArchive::Release::Codename="$suite" \
    -o APT::FTPArchive::Release::Architectures=amd64 -o APT::FTPArchive::Release::Components="$components"
fi
rm -f "$release_dir/Release" "$release_dir/InRelease" "$release_dir/Release.gpg"
apt-ftparchive "$@" release "$release_dir" > "/tmp/Release.$$"
mv "/tmp/Release.$$" "$release_dir/Release"
gpg --homedir "$gnupghome" --batch --yes --local-user "$keyid" \
  --clearsign -o "$release_dir/InRelease" "$release_dir/Release"
gpg --homedir "$gnupghome" --batch --yes --local-user "$keyid" \
  --armor --detach-sign -o "$release_dir/Release.gpg" "$release_dir/Release"
echo "build-apt-repo: $(find . -name '*.deb' | wc -l) packages signed by $keyid"
