#!/usr/bin/env bash
# The delta table of docs/benchmarks.md: bytes on the wire, both directions, to bring a copy of
# OLD up to NEW for every public workload, with `ferry get` and rsync (pull, with and without
# -z) through the same counting remote shell (scripts/count-rsh.py relays the session's stdin
# and stdout and records the bytes it carried), next to the near-ideal delta
# (`zstd -19 --long=27 --patch-from=old.tar new.tar`). Ferry runs twice: against a server that
# never saw the old tree (as rsync), and against one that served it to this client before
# (`get` of old, then the export replaced by new, then `get` again: the server's history and the
# client's cache hold the old version), both with the down direction paced at 1.5 Mbit/s (the
# lab's cable profile): the level of large frames against old data follows the link, as on a
# real one (19 while the link is the bottleneck; on an unpaced pipe it would fall to the
# session's level after the first frame). Then a receiver with nothing (Ferry at
# the default level, the default over a down direction paced at 1.5 Mbit/s, where the level
# adapts, and at --zstd-level 19, against `tar | zstd -19`) and an unchanged tree.
# Bytes only: no link emulation otherwise, no timing (that is the lab's job).
#
# Usage: bash scripts/deltas.sh WL_DIR
#   WL_DIR holds workloads/<name>/{old,new}, e.g. built by ../shared/workloads/build_public.sh
#   (WL=/tmp/wl bash build_public.sh). Needs rsync, zstd, bc and a release build of ferry.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FERRY=${FERRY:-$here/../target/release/ferry}
# The paced down direction, bits per second.
BPS=1500000
RSH=$here/count-rsh.py
W=${1:?usage: deltas.sh WL_DIR}/workloads
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
export COUNT_FILE
# The servers' history and staging: fresh for each run that should not have them.
export XDG_CACHE_HOME=$R/xdg
sum() { awk '{s+=$1+$2} END {print s+0}' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
ferry_get() { # SRC DST [extra args]: bytes both ways
  local src=$1 dst=$2; shift 2
  COUNT_FILE=$R/c; rm -f "$COUNT_FILE" "$R/json"
  "$FERRY" -q get --json "$@" -e "$RSH" --remote-ferry "$FERRY" --cache "$R/cache" "h:$src" "$dst" > "$R/json"
  sum "$COUNT_FILE"
}
tarball() { tar --sort=name --owner=0 --group=0 --numeric-owner -C "$1" -cf "$2" .; }
# Archives of already compressed members, left out of the compressible geometric mean.
archive() { case $1 in django-sdist|numpy-whl-raw|docx-edit) return 0;; esac; return 1; }

printf '| workload | new size | ferry get | ferry get, server saw old | rsync -z | rsync | near-ideal | ferry / rsync -z | ferry / near-ideal | saw old / near-ideal |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
lr=0; lh=0; li=0; n=0; lr_all=0; n_all=0
for w in $(ls "$W"); do
  old=$W/$w/old new=$W/$w/new
  size=$(du -sb "$new" | cut -f1)
  rm -rf "$R/dst" "$R/cache" "$R/xdg"; cp -a "$old" "$R/dst"
  f=$(COUNT_DOWN_BPS=$BPS ferry_get "$new" "$R/dst")
  if diff -r "$new" "$R/dst" | grep -v "^Only in $R/dst" | grep -q .; then echo "ferry result differs for $w" >&2; exit 1; fi
  rm -rf "$R/dst" "$R/cache" "$R/xdg" "$R/srv"; mkdir "$R/srv"; cp -a "$old" "$R/srv/t"
  ferry_get "$R/srv/t" "$R/dst" > /dev/null
  rm -rf "$R/srv/t"; cp -a "$new" "$R/srv/t"
  h=$(COUNT_DOWN_BPS=$BPS ferry_get "$R/srv/t" "$R/dst")
  if diff -r "$new" "$R/dst" | grep -v "^Only in $R/dst" | grep -q .; then echo "ferry (history) result differs for $w" >&2; exit 1; fi
  rm -rf "$R/dst"; cp -a "$old" "$R/dst"
  COUNT_FILE=$R/c; rm -f "$COUNT_FILE"
  rsync -a -z --delete -e "$RSH" "h:$new/" "$R/dst/"
  rz=$(sum "$COUNT_FILE")
  rm -rf "$R/dst"; cp -a "$old" "$R/dst"
  rm -f "$COUNT_FILE"
  rsync -a --delete -e "$RSH" "h:$new/" "$R/dst/"
  r=$(sum "$COUNT_FILE")
  tarball "$old" "$R/old.tar"; tarball "$new" "$R/new.tar"
  ideal=$(zstd -q -19 --long=27 --patch-from="$R/old.tar" -c "$R/new.tar" 2>/dev/null | wc -c)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$w" "$size" "$f" "$h" "$rz" "$r" \
    "$ideal" "$(ratio "$f" "$rz")" "$(ratio "$f" "$ideal")" "$(ratio "$h" "$ideal")"
  lr_all=$(awk -v s="$lr_all" -v a="$f" -v b="$ideal" 'BEGIN {print s + log(a/b)}'); n_all=$((n_all + 1))
  if ! archive "$w"; then
    lr=$(awk -v s="$lr" -v a="$f" -v b="$ideal" 'BEGIN {print s + log(a/b)}')
    lh=$(awk -v s="$lh" -v a="$h" -v b="$ideal" 'BEGIN {print s + log(a/b)}')
    li=$(awk -v s="$li" -v a="$rz" -v b="$ideal" 'BEGIN {print s + log(a/b)}'); n=$((n + 1))
  fi
done
echo
gm() { awk -v s="$1" -v n="$2" 'BEGIN {printf "%.2f", exp(s/n)}'; }
echo "Geometric mean of ferry / near-ideal over the $n compressible workloads (all but the three archives): $(gm "$lr" "$n"); with a server that saw the old tree: $(gm "$lh" "$n") (rsync -z / near-ideal: $(gm "$li" "$n")); ferry over all $n_all: $(gm "$lr_all" "$n_all")."
echo
printf '| receiver with nothing | tar \\| zstd -19 | ferry get | ratio | ferry get, down paced at 1.5 Mbit/s | ratio | ferry get --zstd-level 19 | ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|\n'
for w in django-tree crates-vendor numpy-whl-tree text-insert; do
  new=$W/$w/new
  t=$(tar --sort=name -C "$new" -cf - . | zstd -q -19 -T0 -c | wc -c)
  rm -rf "$R/dst" "$R/cache" "$R/xdg"; f=$(ferry_get "$new" "$R/dst")
  # The default level adapts to the link: on a slow one it climbs toward 19.
  rm -rf "$R/dst" "$R/cache" "$R/xdg"; fp=$(COUNT_DOWN_BPS=$BPS ferry_get "$new" "$R/dst")
  rm -rf "$R/dst" "$R/cache" "$R/xdg"; f19=$(ferry_get "$new" "$R/dst" --zstd-level 19)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$w" "$t" "$f" "$(ratio "$f" "$t")" \
    "$fp" "$(ratio "$fp" "$t")" "$f19" "$(ratio "$f19" "$t")"
done
echo
new=$W/django-tree/new
files=$(find "$new" -type f | wc -l)
rm -rf "$R/dst" "$R/cache"; cp -a "$new" "$R/dst"
u=$(ferry_get "$new" "$R/dst")
trips=$(grep -o '"round_trips":[0-9]*' "$R/json" | cut -d: -f2)
echo "Unchanged tree (django-tree, $files files, already at the destination): $u bytes both ways, $trips round trips in all (the Hello included)."
