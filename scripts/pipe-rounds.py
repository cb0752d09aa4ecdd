#!/usr/bin/env python3
"""Cold `ferry get` of one workload through a local pipe (the server run by a stand-in remote
shell on this machine), several builds taking turns, ROUNDS times; prints each build's median
wall time. Before each run: a fresh destination holding the workload's old/, fresh caches on
both sides, and a `sync`. On a shared, noisy machine, turns measure two builds better than
runs minutes apart.

    scripts/pipe-rounds.py ROUNDS WORKLOAD_DIR BINARY...
    scripts/pipe-rounds.py 20 /tmp/lw/workloads/mbox-append /tmp/ferry-before target/release/ferry
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

rounds, workload, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
work = tempfile.mkdtemp(prefix="ferry-pipe-rounds-")
rsh = os.path.join(work, "rsh")
with open(rsh, "w") as f:
    f.write('#!/bin/sh\nshift\nexec sh -c "$*"\n')
os.chmod(rsh, 0o755)
state, dst = os.path.join(work, "state"), os.path.join(work, "dst")
times = {b: [] for b in bins}
try:
    for _ in range(rounds):
        for b in bins:
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run(["cp", "-a", os.path.join(workload, "old"), dst], check=True)
            subprocess.run(["sync"], check=True)
            start = time.perf_counter()
            subprocess.run(
                [b, "-q", "get", f"localhost:{workload}/new", dst, "-e", rsh,
                 "--remote-ferry", f"env XDG_CACHE_HOME={state}/server {b}",
                 "--cache", f"{state}/cache"],
                check=True, stdout=subprocess.DEVNULL)
            times[b].append((time.perf_counter() - start) * 1000)
finally:
    shutil.rmtree(work, ignore_errors=True)
for b in bins:
    t = sorted(times[b])
    n = len(t)
    print(f"{b}: median {statistics.median(t):.0f} ms, quartiles {t[n // 4]:.0f}-{t[3 * n // 4]:.0f} (n={n})")
