#!/usr/bin/env bash
# What one new small file costs through a mount, the server over a local pipe: N files made by
# open(O_CREAT|O_TRUNC), write, close (perl, one process), timed per call, with the CPU time and
# context switches of the mount and its server per file (perf stat). Needs root (FUSE), perl
# and perf. The export and the cache live under $TMPDIR (default /tmp).
#
#   scripts/mount-create-cost.sh [FERRY_BINARY] [N]
set -euo pipefail
F=$(realpath "${1:-target/release/ferry}")
N=${2:-1000}
W=$(mktemp -d "${TMPDIR:-/tmp}/ferry-create-cost.XXXXXX")
mkdir -p "$W/srv" "$W/mnt"
printf '#!/bin/sh\nshift\nexec sh -c "$*"\n' >"$W/rsh" # HOST dropped: the server runs here
chmod +x "$W/rsh"
trap '"$F" umount "$W/mnt" >/dev/null 2>&1 || umount -l "$W/mnt" 2>/dev/null; rm -rf "$W"' EXIT
"$F" mount "localhost:$W/srv" "$W/mnt" -e "$W/rsh" --remote-ferry "$F" --cache "$W/cache" -q 2>/dev/null
mkdir "$W/mnt/d"
server=$(pgrep -f "serve --stdio $W" | head -1)
mount=$(pgrep -f "mount localhost:$W/srv" | head -1)
perf stat -e context-switches,task-clock -p "$server,$mount" -o "$W/stat" -- perl -e '
use Time::HiRes qw(time); use Fcntl;
my ($dir, $n) = @ARGV; my ($to, $tw, $tc) = (0, 0, 0);
for my $i (1..$n) {
  my $t0 = time; sysopen(my $fh, "$dir/f$i", O_WRONLY|O_CREAT|O_TRUNC) or die "$!";
  my $t1 = time; syswrite($fh, "$i\n");
  my $t2 = time; close($fh) or die "$!";
  my $t3 = time; $to += $t1 - $t0; $tw += $t2 - $t1; $tc += $t3 - $t2;
}
printf "per file: open %.0f us, write %.0f us, close %.0f us\n", $to*1e6/$n, $tw*1e6/$n, $tc*1e6/$n;
' "$W/mnt/d" "$N"
switches=$(awk '/context-switches/ {gsub(",", "", $1); print $1}' "$W/stat")
cpu=$(awk '/task-clock/ {gsub(",", "", $1); print $1}' "$W/stat")
echo "per file: $((switches / N)) context switches, $(echo "$cpu * 1000 / $N" | bc) us of CPU (mount and server)"
