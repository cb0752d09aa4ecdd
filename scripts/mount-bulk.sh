#!/usr/bin/env bash
# Metadata-heavy work through a mount, Ferry against sshfs in one run, both over a local pipe
# (Ferry's server through a remote shell that runs it here; sshfs through sftp-server on a
# pipe): N small files made in one directory and removed, `cp -a` and `rsync -a` of a header
# tree, `git clone` of a repository, `rm -rf` of them, 100 SQLite transactions of 100 rows (as
# the lab's `sqlite`), and `make -j2` of 40 small C files (as the lab's `build`). Prints one
# line per workload and tool: seconds, and the exit code. Needs root (FUSE), sshfs,
# openssh-sftp-server, rsync, gcc and make.
#
#   scripts/mount-bulk.sh [FERRY_BINARY] [ROUNDS] [N]
#
# Defaults: target/release/ferry, 2 rounds, 2000 files; the tree /usr/include/linux and the
# repository this script is in. Both servers' exports and Ferry's cache live under $TMPDIR
# (default /tmp): point it at the file system to measure on (fsync costs differ by far).
# FERRY_MOUNT_ARGS: more arguments for `ferry mount` (say `--zstd-level 3`).
set -uo pipefail
F=$(realpath "${1:-target/release/ferry}")
ROUNDS=${2:-2}
N=${3:-2000}
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)/.git
W=$(mktemp -d "${TMPDIR:-/tmp}/ferry-mount-bulk.XXXXXX")
M=$W/mnt S=$W/srv
mkdir -p "$M"
printf '#!/bin/sh\nshift\nexec sh -c "$*"\n' >"$W/rsh" # HOST dropped: the server runs here
printf '#!/bin/sh\nexec /usr/lib/openssh/sftp-server\n' >"$W/sftp"
chmod +x "$W/rsh" "$W/sftp"
trap 'fusermount3 -u "$M" 2>/dev/null; umount "$M" 2>/dev/null; rm -rf "$W"' EXIT

mount_it() {
  rm -rf "$S" "$W/cache"
  mkdir -p "$S"
  if [[ $1 == ferry ]]; then
    "$F" mount "localhost:$S" "$M" -e "$W/rsh" --remote-ferry "$F" --cache "$W/cache" -q ${FERRY_MOUNT_ARGS:-} 2>/dev/null
  else
    sshfs -o ssh_command="$W/sftp" "localhost:$S" "$M"
  fi
}

unmount_it() {
  if [[ $1 == ferry ]]; then "$F" umount "$M"; else fusermount3 -u "$M"; fi
}

timed() {
  local tool=$1 what=$2
  shift 2
  local s e rc
  s=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  rc=$?
  e=$(date +%s.%N)
  printf '%-6s %-22s %7.2f s  exit %d\n' "$tool" "$what" "$(echo "$e - $s" | bc)" "$rc"
}

SQL=$W/sql
bash "$(dirname "$0")/sqlite-transactions.sh" >"$SQL"

# The C project: 40 files that include one header, and a Makefile (copied in untimed).
P=$W/proj
mkdir -p "$P"
printf '#define SCALE 3\nstatic inline long scale(long x) { return x * SCALE; }\n' >"$P/common.h"
for ((f = 0; f < 40; f++)); do
  {
    echo '#include "common.h"'
    for ((g = 0; g < 12; g++)); do
      echo "long f${f}_$g(long a) { long s = 0; for (long i = 0; i < a; i++) s += scale(i) ^ $((f * 12 + g)); return s; }"
    done
  } >"$P/m$f.c"
done
printf 'OBJS = %s\nlib.a: $(OBJS)\n\tar rcs lib.a $(OBJS)\n%%.o: %%.c common.h\n\tgcc -O1 -c $< -o $@\n' \
  "$(cd "$P" && ls m*.c | sed 's/\.c$/.o/' | tr '\n' ' ')" >"$P/Makefile"

make_files() {
  mkdir "$M/flat" || return 1
  local i
  for ((i = 1; i <= N; i++)); do echo "$i" >"$M/flat/f$i" || return 1; done
}

for ((r = 1; r <= ROUNDS; r++)); do
  for tool in ferry sshfs; do
    mount_it "$tool"
    timed "$tool" "make $N files" make_files
    timed "$tool" "rm -rf $N files" rm -rf "$M/flat"
    timed "$tool" "cp -a linux headers" cp -a /usr/include/linux "$M/inc"
    timed "$tool" "git clone" git clone -q "file://$REPO" "$M/repo"
    timed "$tool" "rm -rf headers" rm -rf "$M/inc"
    timed "$tool" "rm -rf clone" rm -rf "$M/repo"
    timed "$tool" "sqlite 100 transactions" sh -c "sqlite3 '$M/data.db' <'$SQL'"
    timed "$tool" "rsync -a linux headers" rsync -a /usr/include/linux/ "$M/rs/"
    timed "$tool" "rm -rf rsync'd headers" rm -rf "$M/rs"
    cp -a "$P" "$M/proj"
    timed "$tool" "make -j2 (40 C files)" make -s -j2 -C "$M/proj"
    unmount_it "$tool"
  done
done
