#!/bin/bash
# Tries an apt source in a scratch apt state and prints what apt says, then
# the `apt-cache madison` lines of one package. Touches nothing of the host's
# apt configuration or package lists; everything lives in a temporary
# directory that is removed on exit.
#
# Input from the environment:
#   TRIAL_SOURCES          the deb822 source to try
#   TRIAL_KEY_URL          a key to fetch and sign with ("" = the source's Signed-By)
#   TRIAL_KEYRING_DEB_URL  a cuda-keyring .deb whose keyring signs ("" = none)
#   TRIAL_PACKAGE          the package whose offered versions are printed
#   TRIAL_OWN_FILE         the source's own file, left out of the host's
#   TRIAL_REPLACED         the files the source replaces (space-separated),
#                          left out of the host's too ("" = none)
#   TRIAL_SHOW             packages whose stanzas are printed after the madison
#                          lines, below a line "[stanzas]" ("" = none)
#   TRIAL_SHOW_VERSION     only their versions of this upstream version ("" = all)
#   TRIAL_SIMULATE         packages whose installation is simulated after the
#                          trial, below a line "[simulation]" and ending with
#                          "[simulation exit N]" ("" = none): names, or
#                          name=<version pattern> (535.261.03-*), resolved to
#                          the first version offered that matches
#   TRIAL_PREFERENCES      apt preferences the install will have (the pins entry
#                          point main writes), in place of the host's files
#                          TRIAL_OWN_PREFERENCES (space-separated paths), for the
#                          simulation: a release older than the newest offered
#                          is then the candidate of the driver's dependencies too
#   TRIAL_RELEASE          installed packages whose hold the simulation lifts,
#                          as the install does before it runs; every other
#                          hold stays, so the simulation refuses what the
#                          install would refuse
#
# The simulation sees the host's sources with this one in place of the
# role's own file, the host's package lists with this source's fresh ones,
# and a copy of dpkg's status (its holds but those of TRIAL_RELEASE); it
# changes nothing. With TRIAL_SOURCES empty there is no trial: the
# simulation alone, against the host's own sources and lists.
#
# Two trials: the new source alone, downloaded and verified (signature,
# reachability, versions); and the new source beside the host's own sources,
# parsed only, which catches what would break every apt run afterwards (two
# sources for one URL with different Signed-By).
set -euo pipefail
key_url=${TRIAL_KEY_URL:-} keyring_deb_url=${TRIAL_KEYRING_DEB_URL:-} package=${TRIAL_PACKAGE:-}
tmp=$(mktemp -d /tmp/gpufleet-repository-trial.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/cache/archives/partial"

# The simulated installation (TRIAL_SIMULATE), with the apt options given.
simulate() {
  local sim=("$@" -o "Dir::State::status=$tmp/status" -o "Dir::Cache=$tmp/simcache" -o "Debug::NoLocking=1")
  mkdir -p "$tmp/simcache/archives/partial"
  python3 - "$tmp/status" ${TRIAL_RELEASE:-} <<'PY'
import re, sys
release = set(sys.argv[2:])
out = []
with open("/var/lib/dpkg/status") as status:
    for paragraph in status.read().split("\n\n"):
        name = re.match(r"Package: (\S+)", paragraph)
        if name and name.group(1) in release:
            paragraph = re.sub(r"^Status: hold ", "Status: install ", paragraph, count=1, flags=re.M)
        out.append(paragraph)
with open(sys.argv[1], "w") as copy:
    copy.write("\n\n".join(out))
PY
  local specs=() spec name pattern version
  for spec in $TRIAL_SIMULATE; do
    name=${spec%%=*} pattern=${spec#*=} version=""
    if [ "$name" != "$spec" ]; then
      while read -r offered; do
        # shellcheck disable=SC2254 # the pattern is a glob on purpose
        case "$offered" in $pattern) version=$offered; break ;; esac
      done < <(apt-cache "${sim[@]}" madison "$name" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}')
      # No version matches: the bare name, apt's candidate (a package the source versions on its own).
      spec="$name${version:+=$version}"
    fi
    specs+=("$spec")
  done
  echo "[simulation]"
  local code=0
  apt-get "${sim[@]}" -s install --no-install-recommends --allow-downgrades "${specs[@]}" 2>&1 || code=$?
  echo "[simulation exit $code]"
}

if [ -z "${TRIAL_SOURCES:-}" ]; then
  [ -z "${TRIAL_SIMULATE:-}" ] || simulate
  exit 0
fi
printf '%s\n' "$TRIAL_SOURCES" > "$tmp/parts/trial.sources"

fetch() {
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=20) as r, open(sys.argv[2], "wb") as f:
        f.write(r.read())
except Exception as e:  # reported to the play as apt-style error line
    print(f"E: cannot fetch {sys.argv[1]}: {e}")
    sys.exit(3)
PY
}

if [ -n "$key_url" ]; then
  fetch "$key_url" "$tmp/key.asc"
  sed -i "s|^Signed-By: .*|Signed-By: $tmp/key.asc|" "$tmp/parts/trial.sources"
elif [ -n "$keyring_deb_url" ]; then
  fetch "$keyring_deb_url" "$tmp/cuda-keyring.deb"
  dpkg-deb -x "$tmp/cuda-keyring.deb" "$tmp/root"
  sed -i "s|^Signed-By: /|Signed-By: $tmp/root/|" "$tmp/parts/trial.sources"
fi

# Beside the host's own sources: apt parses them all (nothing is downloaded).
mkdir -p "$tmp/host-parts"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -e "$f" ] && [ "$f" != "${TRIAL_OWN_FILE:-}" ] || continue
  case " ${TRIAL_REPLACED:-} " in *" $f "*) continue ;; esac
  cp "$f" "$tmp/host-parts/"
done
cp "$tmp/parts/trial.sources" "$tmp/host-parts/$(basename "${TRIAL_OWN_FILE:-gpufleet.sources}")"
out=$(apt-cache -o "Dir::Etc::SourceParts=$tmp/host-parts" -o "Dir::State::Lists=$tmp/lists" policy 2>&1 >/dev/null) || true
if echo "$out" | grep -qE '^E:'; then echo "$out" | grep -E '^E:'; exit 2; fi

opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$tmp/parts"
      -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
      -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1" -o "Acquire::Retries=2")
out=$(apt-get "${opts[@]}" -q update 2>&1) || { echo "$out" | grep -E '^(E|W):' || echo "$out"; exit 2; }
if echo "$out" | grep -qE '^(E|W):'; then echo "$out" | grep -E '^(E|W):'; exit 2; fi
apt-cache "${opts[@]}" madison "$package" || true
# The stanzas (Depends included) of the packages to show, at the version asked for.
if [ -n "${TRIAL_SHOW:-}" ]; then
  echo "[stanzas]"
  for name in $TRIAL_SHOW; do
    apt-cache "${opts[@]}" madison "$name" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' | sort -u |
      while read -r version; do
        # "<upstream>-*" (the version asked for, with any revision), or every version.
        case "${version#*:}-" in
          "${TRIAL_SHOW_VERSION:+$TRIAL_SHOW_VERSION-}"*) apt-cache "${opts[@]}" show "$name=$version" 2>/dev/null || true ;;
        esac
      done
  done
fi
if [ -n "${TRIAL_SIMULATE:-}" ]; then
  # The host's package lists, this source's fresh ones in place of the host's copy of them.
  mkdir -p "$tmp/simlists/partial"
  for f in /var/lib/apt/lists/*; do
    [ -f "$f" ] && [ "${f##*/}" != lock ] && ln -s "$f" "$tmp/simlists/"
  done
  for f in "$tmp/lists"/*; do
    [ -f "$f" ] && cp -f --remove-destination "$f" "$tmp/simlists/"
  done
  # The host's preferences, the pins this source will write in place of its own files.
  mkdir -p "$tmp/prefs"
  for f in /etc/apt/preferences.d/*; do
    [ -f "$f" ] || continue
    case " ${TRIAL_OWN_PREFERENCES:-} " in *" $f "*) continue ;; esac
    cp "$f" "$tmp/prefs/"
  done
  [ -z "${TRIAL_PREFERENCES:-}" ] || printf '%s\n' "$TRIAL_PREFERENCES" > "$tmp/prefs/gpufleet-simulation.pref"
  simulate -o "Dir::Etc::SourceParts=$tmp/host-parts" -o "Dir::State::Lists=$tmp/simlists" \
    -o "Dir::Etc::PreferencesParts=$tmp/prefs"
fi
