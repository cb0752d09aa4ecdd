#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS each, one after another, and prints one
# line per target: runs, seconds, and whether it found a crash. Needs the nightly toolchain and
# cargo-fuzz (`cargo install cargo-fuzz`). Crashes are kept in fuzz/artifacts/TARGET/; make
# each a regression test before fixing it.
#
#   scripts/fuzz.sh 60                 # every target for a minute
#   scripts/fuzz.sh 3600 server client # an hour each for two
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
# cc instruments C dependencies (zstd) with GCC's AddressSanitizer when rustc runs ASan; GCC's
# use-after-scope poisoning of a constant local the compiler made global does not match LLVM's
# runtime and reports an in-bounds read in zstd (ZSTD_selectBtGetAllMatches) as
# stack-use-after-scope. The C code keeps ASan, without that one check.
export CFLAGS="${CFLAGS:-} -fno-sanitize-address-use-after-scope"
secs=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build -O >/dev/null || exit 1
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  extra=()
  # The api target's daemon runs for the whole process, its threads with their thread-locals
  # alive at exit: LeakSanitizer's report then (after a 1,800 s run with no failure, an empty
  # "crash") is no leak.
  # (-detect_leaks=0 stops libFuzzer's checks between inputs; ASAN_OPTIONS the one at exit,
  # which otherwise writes an empty "crash" when a 3,700 s run ends.)
  asan=${ASAN_OPTIONS:-}
  [[ $t == api ]] && extra=(-detect_leaks=0) && asan=detect_leaks=0
  ASAN_OPTIONS=$asan cargo +nightly fuzz run -O "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1
  rc=$?
  runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  if ((rc == 0)); then
    echo "$t: ${runs:-?} runs in ${secs} s, no crash"
  else
    echo "$t: CRASH (exit $rc) after ${runs:-?} runs; see $log and fuzz/artifacts/$t/"
    grep -a -m3 -E 'panicked|ERROR' "$log"
    status=1
  fi
done
exit $status
