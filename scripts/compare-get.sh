#!/usr/bin/env bash
# Bytes on the wire, both directions, to bring a copy of OLD up to NEW for every workload:
# `ferry get` against rsync (pull, with and without -z), through the same counting remote shell
# (scripts/count-rsh.py relays the session's stdin/stdout and records the bytes it carried).
# Interim tool until `ferry lab` (no link emulation, no timing: bytes only).
#
# Usage: bash scripts/compare-get.sh WL_DIR
#   WL_DIR holds workloads/<name>/{old,new}, e.g. built by ../shared/workloads/build_public.sh
#   (WL=/tmp/wl bash build_public.sh). Needs rsync and a release build of ferry.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FERRY=${FERRY:-$here/../target/release/ferry}
RSH=$here/count-rsh.py
W=${1:?usage: compare-get.sh WL_DIR}/workloads
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
export COUNT_FILE
sum() { awk '{s+=$1+$2} END {print s+0}' "$1"; }
printf '| workload | new size | ferry get | rsync -z | rsync | ferry / rsync -z |\n|---|---:|---:|---:|---:|---:|\n'
for w in $(ls "$W"); do
  new=$W/$w/new; size=$(du -sb "$new" | cut -f1)
  rm -rf "$R/dst" "$R/cache"; cp -a "$W/$w/old" "$R/dst"
  COUNT_FILE=$R/c.ferry; rm -f "$COUNT_FILE"
  "$FERRY" -q get -e "$RSH" --remote-ferry "$FERRY" --cache "$R/cache" "h:$new" "$R/dst" >/dev/null
  if diff -r "$new" "$R/dst" | grep -v "^Only in $R/dst" | grep -q .; then echo "ferry result differs for $w" >&2; exit 1; fi
  f=$(sum "$COUNT_FILE")
  rm -rf "$R/dst"; cp -a "$W/$w/old" "$R/dst"
  COUNT_FILE=$R/c.rz; rm -f "$COUNT_FILE"
  rsync -a -z --delete -e "$RSH" "h:$new/" "$R/dst/"
  rz=$(sum "$COUNT_FILE")
  rm -rf "$R/dst"; cp -a "$W/$w/old" "$R/dst"
  COUNT_FILE=$R/c.r; rm -f "$COUNT_FILE"
  rsync -a --delete -e "$RSH" "h:$new/" "$R/dst/"
  r=$(sum "$COUNT_FILE")
  printf '| %s | %s | %s | %s | %s | %.2f |\n' "$w" "$size" "$f" "$rz" "$r" "$(awk -v a="$f" -v b="$rz" 'BEGIN {print a/b}')"
done
