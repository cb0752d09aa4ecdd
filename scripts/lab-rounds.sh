#!/bin/bash
# Runs the lab with several ferry binaries in turn, ROUNDS times, and prints the median time and
# bytes (KB, both ways) of each workload and contender: how two builds compare on a shared,
# noisy machine (a build's run and another's minutes apart differ by tens of per cent).
#
#   scripts/lab-rounds.sh ROUNDS PROFILE WORKLOADS_DIR BINARY...
#   scripts/lab-rounds.sh 3 lan /tmp/lw/workloads /tmp/ferry-before target/release/ferry
#
# Results go to /tmp/lab-rounds/PROFILE-N-R (N: the binary's place in the list, R: the round).
# LAB_ARGS adds arguments to every run (`LAB_ARGS="--workload crates-vendor"`).
set -euo pipefail
rounds=$1 profile=$2 workloads=$3
shift 3
out=/tmp/lab-rounds
mkdir -p "$out"
for r in $(seq "$rounds"); do
  n=0
  for bin in "$@"; do
    n=$((n + 1))
    "$bin" lab -q --profile "$profile" --workloads "$workloads" --tool ferry --tool ferry-warm \
      --tool rsync-z ${LAB_ARGS:-} --out "$out/$profile-$n-$r" >/dev/null
  done
done
python3 - "$out" "$profile" "$rounds" "$#" <<'PY'
import collections, json, statistics, sys
out, profile, rounds, bins = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t, b = collections.defaultdict(list), collections.defaultdict(list)
for n in range(1, bins + 1):
    for r in range(1, rounds + 1):
        for run in json.load(open(f"{out}/{profile}-{n}-{r}/results.json"))["runs"]:
            if run["status"] != "ok":
                continue
            tool = run["tool"] if run["tool"] == "rsync-z" else f"{n}:{run['tool']}"
            t[(run["workload"], tool)].append(run["seconds"])
            b[(run["workload"], tool)].append(run["bytes_down"] + run["bytes_up"])
tools = sorted({k[1] for k in t})
print("workload".ljust(16) + "".join(x.rjust(18) for x in tools))
for w in sorted({k[0] for k in t}):
    cells = [
        f"{statistics.median(t[(w, x)]):.2f} s {statistics.median(b[(w, x)]) // 1000:.0f}"
        if t[(w, x)] else "" for x in tools
    ]
    print(w.ljust(16) + "".join(c.rjust(18) for c in cells))
PY
