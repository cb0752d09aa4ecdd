#!/usr/bin/env bash
# Ferry's bytes on the wire (both ways, counted by the carrying remote shell) to bring OLD up to
# NEW for every public workload, at average chunk sizes of 4, 8 and 16 KiB, all other settings
# at their defaults: the measurement behind the default chunk size (docs/benchmarks.md). Each
# size twice, as in scripts/deltas.sh: against a server that never saw the old tree ("cold"),
# and against one that served it to this client before ("warm": its history and the client's
# cache hold the old version).
#
# Usage: bash scripts/chunk-sizes.sh WL_DIR   (as scripts/deltas.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FERRY=${FERRY:-$here/../target/release/ferry}
W=${1:?usage: chunk-sizes.sh WL_DIR}/workloads
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
export COUNT_FILE=$R/c
# The servers' history and staging: fresh for each run that should not have them.
export XDG_CACHE_HOME=$R/xdg
sizes="4096 8192 16384"
get() { # SIZE SRC DST: bytes both ways
  rm -f "$COUNT_FILE"
  "$FERRY" -q get --chunk-size "$1" -e "$here/count-rsh.py" --remote-ferry "$FERRY" \
    --cache "$R/cache" "h:$2" "$3" > /dev/null
  awk '{s+=$1+$2} END {print s}' "$COUNT_FILE"
}
printf '| workload |'
for s in $sizes; do printf ' %s KiB cold | %s KiB warm |' $((s / 1024)) $((s / 1024)); done
printf '\n|---|'; for s in $sizes; do printf -- '---:|---:|'; done; printf '\n'
declare -A logsum
for w in $(ls "$W"); do
  printf '| %s |' "$w"
  for s in $sizes; do
    rm -rf "$R/dst" "$R/cache" "$R/xdg"; cp -a "$W/$w/old" "$R/dst"
    cold=$(get "$s" "$W/$w/new" "$R/dst")
    rm -rf "$R/dst" "$R/cache" "$R/xdg" "$R/srv"; mkdir "$R/srv"; cp -a "$W/$w/old" "$R/srv/t"
    get "$s" "$R/srv/t" "$R/dst" > /dev/null
    rm -rf "$R/srv/t"; cp -a "$W/$w/new" "$R/srv/t"
    warm=$(get "$s" "$R/srv/t" "$R/dst")
    logsum[c$s]=$(awk -v a="${logsum[c$s]:-0}" -v b="$cold" 'BEGIN {print a + log(b)}')
    logsum[w$s]=$(awk -v a="${logsum[w$s]:-0}" -v b="$warm" 'BEGIN {print a + log(b)}')
    printf ' %s | %s |' "$cold" "$warm"
  done
  printf '\n'
done
printf '| geometric mean |'
n=$(ls "$W" | wc -l)
for s in $sizes; do
  for k in c w; do awk -v a="${logsum[$k$s]}" -v n="$n" 'BEGIN {printf " %.0f |", exp(a/n)}'; done
done
printf '\n'
