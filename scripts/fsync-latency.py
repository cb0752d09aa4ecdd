#!/usr/bin/env python3
# Latency of an fdatasync after a 4 KiB write into a 40 KiB file, and of a lookup of a missing
# name, N times each, in DIR (a mount): `python3 scripts/fsync-latency.py DIR N`.
import os, sys, time
d = sys.argv[1]; n = int(sys.argv[2])
p = os.path.join(d, "fs.bin")
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"x" * 40960); os.fsync(fd)
t = time.perf_counter()
for i in range(n):
    os.pwrite(fd, os.urandom(4096), (i % 10) * 4096)
    os.fdatasync(fd)
e = time.perf_counter() - t
os.close(fd)
t2 = time.perf_counter()
for i in range(n):
    try: os.stat(os.path.join(d, "nx%d" % i))
    except FileNotFoundError: pass
e2 = time.perf_counter() - t2
print(f"{n} fdatasyncs {e*1e3/n:.3f} ms each; {n} lookups of missing names {e2*1e3/n:.3f} ms each")
