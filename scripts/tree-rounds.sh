#!/usr/bin/env bash
# Trees over a fast link: `ferry get` and `ferry put` of a tree of many small files by two
# ferry binaries, beside `rsync -a` and `rsync -az` of the same tree, in interleaved rounds,
# through a local "remote shell" that runs the server on this machine (the link is a pair of
# pipes: a LAN, where only the two ends' work counts). Each ferry run has a fresh
# XDG_CACHE_HOME for both ends (nothing known beforehand). The destinations live under
# $TMPDIR: point it at the file system to measure on (a tmpfs leaves the disk out).
# Prints one line per run ("get old 2.11") and the medians at the end.
#
# Usage: bash scripts/tree-rounds.sh OLD_FERRY NEW_FERRY [ROUNDS] [TREE]   (TREE: /usr/include)
set -euo pipefail
old=$(realpath "${1:?usage: tree-rounds.sh OLD NEW [ROUNDS] [TREE]}")
new=$(realpath "${2:?usage: tree-rounds.sh OLD NEW [ROUNDS] [TREE]}")
rounds=${3:-5}
tree=$(realpath "${4:-/usr/include}")
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
cd "$w"
printf '#!/bin/sh\nshift\nif [ "$1" = ferry ]; then shift; exec "$FERRYBIN" "$@"; fi\nexec "$@"\n' > rsh
chmod +x rsh
timed() { # label command...
  local t0 t1
  t0=$(date +%s.%N)
  "${@:2}" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$1 $(echo "$t1 - $t0" | bc)"
}
for r in $(seq 1 "$rounds"); do
  for b in old new; do
    bin=$old; [[ $b == new ]] && bin=$new
    export FERRYBIN=$bin
    rm -rf dst xdg; mkdir dst
    XDG_CACHE_HOME=$w/xdg timed "get $b" "$bin" get -q -e ./rsh "localhost:$tree/" dst/
    rm -rf up xdg; mkdir up
    XDG_CACHE_HOME=$w/xdg timed "put $b" "$bin" put -q -e ./rsh "$tree/" "localhost:$w/up/"
  done
  rm -rf dst; mkdir dst
  timed "get rsync" rsync -a -e ./rsh "localhost:$tree/" dst/
  rm -rf dst; mkdir dst
  timed "get rsync-z" rsync -az -e ./rsh "localhost:$tree/" dst/
  rm -rf up; mkdir up
  timed "put rsync" rsync -a -e ./rsh "$tree/" "localhost:$w/up/"
  rm -rf up; mkdir up
  timed "put rsync-z" rsync -az -e ./rsh "$tree/" "localhost:$w/up/"
done | tee "$w/runs"
echo "medians:"
sort -k1,1 -k2,2 -k3,3n "$w/runs" | awk '
  { k=$1" "$2; v[k]=v[k]" "$3; n[k]++ }
  END { for (k in v) { split(substr(v[k],2), a, " "); print k, a[int((n[k]+1)/2)] } }' | sort
