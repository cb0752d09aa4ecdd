#!/usr/bin/env python3
# A relay that adds DELAY_MS (default 15) milliseconds each way between a remote-shell client
# and the command it runs: `ferry get -e scripts/delay-rsh ...` through a local pipe with a
# long round trip (no netem here). Usage: delay-relay.py COMMAND [ARGS...]. Tried with ferry only:
# an rsync through it did not finish (its end of session is not relayed as it expects).
import sys, os, subprocess, threading, time, queue
D = float(os.environ.get("DELAY_MS", "15")) / 1000
p = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
def pump(src, dst, close):
    q = queue.Queue()
    def reader():
        while True:
            b = os.read(src, 65536)
            q.put((time.monotonic() + D, b))
            if not b: return
    threading.Thread(target=reader, daemon=True).start()
    while True:
        t, b = q.get()
        w = t - time.monotonic()
        if w > 0: time.sleep(w)
        if not b:
            close(); return
        os.write(dst, b)
a = threading.Thread(target=pump, args=(0, p.stdin.fileno(), p.stdin.close))
b = threading.Thread(target=pump, args=(p.stdout.fileno(), 1, lambda: os.close(1)))
a.start(); b.start(); b.join()
