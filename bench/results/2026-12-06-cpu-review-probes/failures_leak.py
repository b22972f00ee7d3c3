"""Loads of names the repository does not hold: each 404s, but ModelControl._failures keeps name → message.
usage: failures_leak.py PID PORT COUNT NAMELEN"""

import sys
import uuid
from pathlib import Path

import httpx

pid, port, count, n = map(int, sys.argv[1:5])


def rss():
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024


c = httpx.Client(timeout=30)
print("rss MB before", rss(), flush=True)
codes = {}
for i in range(count):
    name = uuid.uuid4().hex + "x" * n
    r = c.post(f"http://127.0.0.1:{port}/v2/repository/models/{name}/load")
    codes[r.status_code] = codes.get(r.status_code, 0) + 1
    if (i + 1) % (count // 4) == 0:
        print(i + 1, "loads", codes, "rss MB", rss(), flush=True)
print("example answer", r.status_code, r.text[:200])
