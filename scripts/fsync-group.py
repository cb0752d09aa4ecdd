#!/usr/bin/env python3
"""Small files fsynced one after another, side by side, or by one sync of the file system,
then renamed: what a group of commits costs on the file system under DIR.

    python3 scripts/fsync-group.py DIR N seq|par|syncfs
"""
import os, sys, time, threading
d=sys.argv[1]; n=int(sys.argv[2]); mode=sys.argv[3]
os.makedirs(d, exist_ok=True)
fds=[]
t0=time.time()
for i in range(n):
    fd=os.open(f"{d}/t{i}.{mode}", os.O_CREAT|os.O_WRONLY|os.O_TRUNC, 0o644)
    os.write(fd, b"x"*(100+i%3000)); fds.append(fd)
t1=time.time()
if mode=="seq":
    for fd in fds: os.fsync(fd)
elif mode=="par":
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(16) as ex: list(ex.map(os.fsync, fds))
elif mode=="syncfs":
    os.syncfs(fds[0]) if hasattr(os,'syncfs') else os.sync()
t2=time.time()
for i,fd in enumerate(fds): os.close(fd); os.rename(f"{d}/t{i}.{mode}", f"{d}/f{i}.{mode}")
dfd=os.open(d, os.O_RDONLY); os.fsync(dfd); t3=time.time()
print(f"{mode}: write {t1-t0:.3f} sync {t2-t1:.3f} rename {t3-t2:.3f}")
