#!/usr/bin/env bash
# 100 SQLite transactions of 100 rows (the lab's `sqlite`) through a Ferry mount over a local
# pipe, for each binary given in turn, then through sshfs, ROUNDS times: how builds compare
# on a shared, noisy machine. Prints one line per run: the binary (or sshfs) and seconds.
# Needs root (FUSE), sqlite3, sshfs and openssh-sftp-server.
#
#   TMPDIR=/tmp/tfs scripts/mount-sqlite-rounds.sh ROUNDS BINARY...
set -uo pipefail
R=$1
shift
W=$(mktemp -d "${TMPDIR:-/tmp}/ferry-sqlite.XXXXXX")
trap 'fusermount3 -u "$W/mnt" 2>/dev/null; rm -rf "$W"' EXIT
printf '#!/bin/sh\nshift\nexec sh -c "$*"\n' >"$W/rsh" # HOST dropped: the server runs here
printf '#!/bin/sh\nexec /usr/lib/openssh/sftp-server\n' >"$W/sftp"
chmod +x "$W/rsh" "$W/sftp"
bash "$(dirname "$0")/sqlite-transactions.sh" >"$W/sql"
fresh() {
  rm -rf "$W/srv" "$W/cache"
  mkdir -p "$W/srv/x" "$W/mnt"
}
timed() {
  local s e
  s=$(date +%s.%N)
  sqlite3 "$W/mnt/data.db" <"$W/sql"
  e=$(date +%s.%N)
  printf '%-24s %.3f s\n' "$1" "$(echo "$e - $s" | bc)"
}
for ((r = 1; r <= R; r++)); do
  for b in "$@"; do
    fresh
    "$b" mount "localhost:$W/srv/x" "$W/mnt" -e "$W/rsh" --remote-ferry "$b" --cache "$W/cache" -q 2>/dev/null
    timed "$b"
    "$b" umount "$W/mnt"
  done
  fresh
  sshfs -o ssh_command="$W/sftp" "localhost:$W/srv/x" "$W/mnt"
  timed sshfs
  fusermount3 -u "$W/mnt"
done
