#!/usr/bin/env bash
# The time table of "Uploads through a local pipe" in docs/benchmarks.md: a 1 GiB
# incompressible file put by two ferry binaries and by `rsync -a`, in interleaved rounds,
# through a local "remote shell" that runs the server on this machine (the link is a pair of
# pipes: a fast LAN, where only the two ends' work counts).
#   fresh: a fresh XDG_CACHE_HOME for both ends each run (the server's index knows nothing);
#   again: the same file put again after its removal on the server (the server's index still
#          places its chunks in the removed file).
# Prints one line per run ("fresh old 3.05") and the medians at the end.
#
# Usage: bash scripts/upload-rounds.sh OLD_FERRY NEW_FERRY ROUNDS   (needs rsync; ~1 GiB x 4 of
# free disk in $TMPDIR)
set -euo pipefail
old=$(realpath "${1:?usage: upload-rounds.sh OLD NEW ROUNDS}")
new=$(realpath "${2:?usage: upload-rounds.sh OLD NEW ROUNDS}")
rounds=${3:-5}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
cd "$w"
mkdir src
head -c 1G /dev/urandom > src/big
# The "remote shell": drops the host name, runs `ferry` as $FERRYBIN and anything else as is.
printf '#!/bin/sh\nshift\nif [ "$1" = ferry ]; then shift; exec "$FERRYBIN" "$@"; fi\nexec "$@"\n' > rsh
chmod +x rsh
run() { # label binary
  local t0 t1
  sync
  t0=$(date +%s.%N)
  FERRYBIN=$2 XDG_CACHE_HOME=$w/xdg-$1 "$2" put -q -e ./rsh src/big "localhost:$w/up/big" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$1 $(echo "$t1 - $t0" | bc)"
}
for r in $(seq 1 "$rounds"); do
  for b in old new; do
    bin=$old; [[ $b == new ]] && bin=$new
    rm -rf up "xdg-$b"; mkdir up
    run "$b" "$bin" | sed 's/^/fresh /'
    rm -rf up; mkdir up
    run "$b" "$bin" | sed 's/^/again /'
  done
  rm -rf up2; mkdir up2; sync
  t0=$(date +%s.%N)
  rsync -a -e ./rsh src/big "localhost:$w/up2/"
  t1=$(date +%s.%N)
  echo "rsync - $(echo "$t1 - $t0" | bc)"
done | tee "$w/runs"
echo "medians:"
awk '{print $1" "$2, $3}' "$w/runs" | sort -k1,1 -k2,2 -k3,3n | awk '
  { k=$1" "$2; v[k]=v[k]" "$3; n[k]++ }
  END { for (k in v) { split(substr(v[k],2), a, " "); m=a[int((n[k]+1)/2)]; print k, m } }' | sort
