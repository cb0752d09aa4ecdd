#!/usr/bin/env bash
# Times one command inside a fresh Ferry mount over a local pipe, for each binary given in
# turn, ROUNDS times: how builds compare on a shared, noisy machine. Each run gets a fresh
# export and cache, mounts, runs COMMAND in the mount's root, unmounts. Prints one line per run:
# the binary, seconds, and the command's exit code. Needs root and /dev/fuse.
#
#   TMPDIR=/tmp/tfs scripts/mount-rounds.sh ROUNDS COMMAND BINARY...
#   TMPDIR=/tmp/tfs scripts/mount-rounds.sh 5 'cp -a /usr/include h' /tmp/before target/release/ferry
#
# MOUNT_ARGS adds arguments to every mount (`MOUNT_ARGS="--zstd-level 1"`).
set -uo pipefail
R=$1 CMD=$2
shift 2
W=$(mktemp -d "${TMPDIR:-/tmp}/ferry-rounds.XXXXXX")
trap 'fusermount3 -u "$W/mnt" 2>/dev/null; rm -rf "$W"' EXIT
printf '#!/bin/sh\nshift\nexec sh -c "$*"\n' >"$W/rsh" # HOST dropped: the server runs here
chmod +x "$W/rsh"
for ((r = 1; r <= R; r++)); do
  for b in "$@"; do
    rm -rf "$W/srv" "$W/cache"
    mkdir -p "$W/srv/x" "$W/mnt"
    # shellcheck disable=SC2086
    "$b" mount "localhost:$W/srv/x" "$W/mnt" -e "$W/rsh" --remote-ferry "$b" --cache "$W/cache" \
      ${MOUNT_ARGS:-} -q 2>/dev/null
    s=$(date +%s.%N)
    (cd "$W/mnt" && eval "$CMD") >/dev/null 2>&1
    rc=$?
    e=$(date +%s.%N)
    "$b" umount "$W/mnt"
    printf '%-24s %.3f s  exit %s\n' "$b" "$(echo "$e - $s" | bc)" "$rc"
  done
done
