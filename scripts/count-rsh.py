#!/usr/bin/env python3
"""A remote shell for measurements: drops the host argument, runs the command locally, relays
stdin/stdout and appends 'up down' byte counts to $COUNT_FILE when done. With $COUNT_DOWN_BPS
set, what comes back is paced at that many bits per second (reading no faster, so the sender
meets backpressure as on a slow link); $COUNT_UP_BPS paces what goes out likewise."""
import os, subprocess, sys, threading, time
args = sys.argv[2:]
os.set_blocking(0, True)
os.set_blocking(1, True)
def write_all(fd, b):
    while b:
        n = os.write(fd, b)
        b = b[n:]
p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
up = [0]; down = [0]
up_bps = float(os.environ.get("COUNT_UP_BPS", "0"))
def pump_in():
    start = time.monotonic()
    while True:
        b = os.read(0, 16384 if up_bps else 65536)
        if not b:
            break
        up[0] += len(b)
        if up_bps:
            due = start + up[0] * 8 / up_bps
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
        try:
            p.stdin.write(b); p.stdin.flush()
        except BrokenPipeError:
            break
    try: p.stdin.close()
    except Exception: pass
t = threading.Thread(target=pump_in, daemon=True); t.start()
bps = float(os.environ.get("COUNT_DOWN_BPS", "0"))
start = time.monotonic()
while True:
    b = os.read(p.stdout.fileno(), 16384 if bps else 65536)
    if not b:
        break
    down[0] += len(b)
    write_all(1, b)
    if bps:
        due = start + down[0] * 8 / bps
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
rc = p.wait()
with open(os.environ.get("COUNT_FILE", "/tmp/counts"), "a") as f:
    f.write(f"{up[0]} {down[0]}\n")
sys.exit(rc)
