#!/usr/bin/env bash
# Ferry's bytes on the wire (both ways, counted by the carrying remote shell) to bring OLD up to
# NEW for every public workload, at average chunk sizes of 4, 8 and 16 KiB, all other settings
# at their defaults: the measurement behind the default chunk size (docs/benchmarks.md).
#
# Usage: bash scripts/chunk-sizes.sh WL_DIR   (as scripts/deltas.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FERRY=${FERRY:-$here/../target/release/ferry}
W=${1:?usage: chunk-sizes.sh WL_DIR}/workloads
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
export COUNT_FILE=$R/c
sizes="4096 8192 16384"
printf '| workload |'; for s in $sizes; do printf ' %s KiB |' $((s / 1024)); done; printf '\n|---|'
for s in $sizes; do printf -- '---:|'; done; printf '\n'
declare -A logsum
for w in $(ls "$W"); do
  printf '| %s |' "$w"
  for s in $sizes; do
    rm -rf "$R/dst" "$R/cache" "$COUNT_FILE"; cp -a "$W/$w/old" "$R/dst"
    "$FERRY" -q get --chunk-size "$s" -e "$here/count-rsh.py" --remote-ferry "$FERRY" \
      --cache "$R/cache" "h:$W/$w/new" "$R/dst" > /dev/null
    b=$(awk '{s+=$1+$2} END {print s}' "$COUNT_FILE")
    logsum[$s]=$(awk -v a="${logsum[$s]:-0}" -v b="$b" 'BEGIN {print a + log(b)}')
    printf ' %s |' "$b"
  done
  printf '\n'
done
printf '| geometric mean |'
n=$(ls "$W" | wc -l)
for s in $sizes; do awk -v a="${logsum[$s]}" -v n="$n" 'BEGIN {printf " %.0f |", exp(a/n)}'; done
printf '\n'
