#!/usr/bin/env bash
# The upload table of docs/benchmarks.md: bytes on the wire, both directions, to bring the
# server's copy of OLD up to NEW with `ferry put` (the server holds the old tree; the client
# the new one), next to `ferry get` of the same change the other way (the client holds the old
# tree; the server the new one), `rsync -z` pushing it, and the near-ideal delta
# (`zstd -19 --long=27 --patch-from=old.tar new.tar`). All through the same counting remote
# shell (scripts/count-rsh.py), the sending direction paced at 1.5 Mbit/s (the level of large
# frames against old data follows the link, as on a real one). `put, cache warm` is the usual
# case of a tool run again and again: the client fetched the old tree from this server before,
# so its cache holds the old data the new version dropped.
#
# Usage: bash scripts/uploads.sh WL_DIR   (WL_DIR from lab/workloads.sh; needs rsync, zstd and
# a release build of ferry)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FERRY=${FERRY:-$here/../target/release/ferry}
BPS=1500000
RSH=$here/count-rsh.py
W=${1:?usage: uploads.sh WL_DIR}/workloads
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
export COUNT_FILE XDG_CACHE_HOME=$R/xdg
sum() { awk '{s+=$1+$2} END {print s+0}' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
run() { # bytes both ways of a ferry command (its arguments)
  COUNT_FILE=$R/c; rm -f "$COUNT_FILE"
  "$FERRY" -q "$@" -e "$RSH" --remote-ferry "$FERRY" --cache "$R/cache" > /dev/null
  sum "$COUNT_FILE"
}
same() { if diff -r "$1" "$2" | grep -q .; then echo "$3: result differs" >&2; exit 1; fi; }
tarball() { tar --sort=name --owner=0 --group=0 --numeric-owner -C "$1" -cf "$2" .; }
archive() { case $1 in django-sdist|numpy-whl-raw|docx-edit) return 0;; esac; return 1; }
printf '| workload | new size | ferry put | put, cache warm | ferry get | rsync -z push | near-ideal | put / get | put / rsync -z | put / near-ideal | get / near-ideal |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
lu=0; lg=0; lw=0; lr=0; n=0; worst_ug=0; over_rz=0
for w in $(ls "$W"); do
  old=$W/$w/old new=$W/$w/new
  size=$(du -sb "$new" | cut -f1)
  # Up: the server holds the old tree, the client's cache nothing.
  rm -rf "$R/srv" "$R/cache" "$R/xdg"; mkdir "$R/srv"; cp -a "$old" "$R/srv/t"
  u=$(COUNT_UP_BPS=$BPS run put --delete "$new" "h:$R/srv/t")
  same "$new" "$R/srv/t" "put $w"
  # Up, warm: the client fetched the old tree from this server first.
  rm -rf "$R/srv" "$R/cache" "$R/xdg" "$R/dst"; mkdir "$R/srv"; cp -a "$old" "$R/srv/t"
  run get "h:$R/srv/t" "$R/dst" > /dev/null
  uw=$(COUNT_UP_BPS=$BPS run put --delete "$new" "h:$R/srv/t")
  same "$new" "$R/srv/t" "put (warm) $w"
  # Down: the client holds the old tree, the server the new one.
  rm -rf "$R/dst" "$R/cache" "$R/xdg"; cp -a "$old" "$R/dst"
  g=$(COUNT_DOWN_BPS=$BPS run get --delete "h:$new" "$R/dst")
  same "$new" "$R/dst" "get $w"
  rm -rf "$R/srv"; mkdir "$R/srv"; cp -a "$old" "$R/srv/t"
  COUNT_FILE=$R/c; rm -f "$COUNT_FILE"
  COUNT_UP_BPS=$BPS rsync -a -z --delete -e "$RSH" "$new/" "h:$R/srv/t/"
  rz=$(sum "$COUNT_FILE")
  tarball "$old" "$R/old.tar"; tarball "$new" "$R/new.tar"
  ideal=$(zstd -q -19 --long=27 --patch-from="$R/old.tar" -c "$R/new.tar" 2>/dev/null | wc -c)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$w" "$size" "$u" "$uw" "$g" \
    "$rz" "$ideal" "$(ratio "$u" "$g")" "$(ratio "$u" "$rz")" "$(ratio "$u" "$ideal")" "$(ratio "$g" "$ideal")"
  if awk -v a="$u" -v b="$rz" 'BEGIN {exit !(a > b)}'; then over_rz=$((over_rz + 1)); fi
  if ! archive "$w"; then
    lu=$(awk -v s="$lu" -v a="$u" -v b="$ideal" 'BEGIN {print s + log(a/b)}')
    lw=$(awk -v s="$lw" -v a="$uw" -v b="$ideal" 'BEGIN {print s + log(a/b)}')
    lg=$(awk -v s="$lg" -v a="$g" -v b="$ideal" 'BEGIN {print s + log(a/b)}')
    lr=$(awk -v s="$lr" -v a="$rz" -v b="$ideal" 'BEGIN {print s + log(a/b)}'); n=$((n + 1))
  fi
done
echo
gm() { awk -v s="$1" -v n="$2" 'BEGIN {printf "%.2f", exp(s/n)}'; }
echo "Geometric mean ÷ near-ideal over the $n compressible workloads: put $(gm "$lu" "$n"), put with a warm cache $(gm "$lw" "$n"), get $(gm "$lg" "$n"), rsync -z push $(gm "$lr" "$n"). Workloads where put sent more than rsync -z: $over_rz."
