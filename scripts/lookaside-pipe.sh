#!/usr/bin/env bash
# Ferry's own cost of lookaside, without the lab's link and stick: the newest release of a tree
# fetched through a local pipe (the server runs here, through a remote shell that drops the
# host) into an empty destination with an empty cache, without a device, with a device holding
# the oldest release, and with one holding the newest; hyperfine compares the three. Put
# TMPDIR on a tmpfs to leave the disk out.
#
#   scripts/lookaside-pipe.sh RELEASES [FERRY_BINARY] [RUNS]
#
# RELEASES: one directory per release, oldest first by name (lab/workloads.sh puts tokio's in
# releases/tokio). Needs hyperfine.
set -euo pipefail
R=$(realpath "$1")
F=$(realpath "${2:-target/release/ferry}")
RUNS=${3:-20}
W=$(mktemp -d "${TMPDIR:-/tmp}/ferry-lookaside-pipe.XXXXXX")
trap 'rm -rf "$W"' EXIT
mapfile -t rels < <(find "$R" -mindepth 1 -maxdepth 1 -type d | sort -V)
((${#rels[@]} >= 2)) || { echo "need two releases in $R" >&2; exit 2; }
cp -a "${rels[-1]}" "$W/tree"
cp -a "${rels[0]}" "$W/old"
cp -a "${rels[-1]}" "$W/new"
printf '#!/bin/sh\nshift\nexec "$@"\n' >"$W/rsh"
chmod +x "$W/rsh"
export XDG_CACHE_HOME=$W/cache XDG_DATA_HOME=$W/data
"$F" -q lookaside index "$W/old" >/dev/null
"$F" -q lookaside index "$W/new" >/dev/null
fetch="rm -rf $W/dst $W/cache/ferry/chunks; $F -q get -e $W/rsh --remote-ferry $F"
from="localhost:$W/tree $W/dst"
hyperfine -r "$RUNS" -w 2 \
  -n none "$fetch --no-lookaside $from" \
  -n "oldest release" "$fetch --lookaside $W/old $from" \
  -n "newest release" "$fetch --lookaside $W/new $from"
