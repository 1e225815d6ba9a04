# gpufleet's apt source files with their URIs, and the record of the file each
# source user wrote last, read without changing anything (run as
# sh -c "<this text>" sh <records directory>): one line each,
#   record<TAB><user><TAB><the file it wrote last>
#   source<TAB><file><TAB><its URIs>
# read by gpufleet.fleet.apt_source_plan (the filter, and the module
# gpufleet.fleet.apt_trial).
for f in "$1"/*; do
  [ -f "$f" ] && printf 'record\t%s\t%s\n' "${f##*/}" "$(head -n 1 "$f")"
done
for f in /etc/apt/sources.list.d/gpufleet-*.sources; do
  [ -f "$f" ] && printf 'source\t%s\t%s\n' "$f" "$(awk '/^URIs:/ { sub(/^URIs:[ \t]*/, ""); print; exit }' "$f")"
done
true
