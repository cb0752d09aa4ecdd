#!/usr/bin/env bash
# The POSIX suite (pjdfstest, the Rust rewrite from crates.io) inside a real ferry mount of a
# fresh export served over a local pipe, as root; prints the suite's summary and the failures
# that tests/posix/expected-failures.txt does not list (each line there names why).
#
#   scripts/posix.sh            # needs root, /dev/fuse, and `cargo install pjdfstest --locked`
#   scripts/posix.sh --ext4     # the same suite on a plain directory, for comparison
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v pjdfstest >/dev/null || { echo "pjdfstest is needed: cargo install pjdfstest --locked" >&2; exit 2; }
id tests >/dev/null 2>&1 || useradd -M -U -s /usr/sbin/nologin tests
work=$(mktemp -d /tmp/ferry-posix.XXXXXX)
# Searchable by the other users the suite acts as (mktemp makes it 0700: every path of theirs
# through it was EACCES before the mount was asked).
chmod 755 "$work"
trap 'ferry umount "$work/mnt" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cat > "$work/pjdfstest.toml" <<'TOML'
[features]

[settings]
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [
  ["nobody", "nogroup"],
  ["tests", "tests"],
]
TOML
mkdir -p "$work/srv" "$work/mnt"
if [[ ${1:-} == --ext4 ]]; then
  dir="$work/srv"
else
  cargo build -q --manifest-path "$root/Cargo.toml" -p ferry
  ferry() { "$root/target/debug/ferry" "$@"; }
  printf '#!/bin/sh\nshift\nexec "$@"\n' > "$work/rsh"
  chmod +x "$work/rsh"
  # A generous timeout: open::interact_2gb has the (debug) server write and hash 2 GiB in one
  # commit, which on a busy machine took more than 10 s without a word to the mount.
  # --allow-other: the suite acts as other users too (without it the kernel refuses them
  # everything, EACCES, before the mount is asked).
  ferry mount -e "$work/rsh" --remote-ferry "$root/target/debug/ferry" --cache "$work/cache" \
    --timeout 300 --allow-other "host:$work/srv" "$work/mnt" >/dev/null
  dir="$work/mnt"
fi
set +e
(cd "$dir" && pjdfstest -c "$work/pjdfstest.toml" -p "$dir") > "$work/log" 2>&1
set -e
grep -a '^Summary' "$work/log"
grep -aE '^[a-z_0-9:]+ +FAILED' "$work/log" | awk '{print $1}' | sort > "$work/failed"
grep -v '^#' "$root/tests/posix/expected-failures.txt" | awk 'NF {print $1}' | sort > "$work/expected"
unexpected=$(comm -23 "$work/failed" "$work/expected")
if [[ -n $unexpected ]]; then
  echo "failures not in tests/posix/expected-failures.txt:"
  echo "$unexpected"
  # What each said (its panic message: the lines up to its backtrace), and the mount's log.
  for c in $unexpected; do
    awk -v c="$c" '$1 == c {on = 1} on && /^Backtrace:/ {exit} on' "$work/log"
  done
  [[ -e $work/cache/mount.log ]] && tail -n 40 "$work/cache/mount.log"
  exit 1
fi
echo "every failure is an expected one ($(wc -l < "$work/failed") of them)"
# Listed, and passing now (skipped cases neither pass nor fail): the list is out of date.
passing=$(comm -13 "$work/failed" "$work/expected" | while read -r c; do
  grep -aqE "^$c +(ok|passed)" "$work/log" && echo "$c"
done)
if [[ -n $passing ]]; then
  echo "listed as expected failures, passing now (remove them from the list):"
  echo "$passing"
fi
