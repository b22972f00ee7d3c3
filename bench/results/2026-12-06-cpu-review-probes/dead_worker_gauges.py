"""With --workers 2: load the server, SIGKILL a worker whose queue is non-empty, stop the load, and show that
cgserve_queue_depth_rows / cgserve_in_flight_batches (multiprocess 'livesum') keep the dead worker's last value
forever (uvicorn restarts the worker; nobody calls prometheus_client.multiprocess.mark_process_dead).
usage: dead_worker_gauges.py HTTP_PORT MANAGER_PID"""

import glob
import http.client
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

hp, manager = int(sys.argv[1]), int(sys.argv[2])
px = (Path(os.environ["ROOT"]) / "models/examples/ankle-boot.u8").read_bytes() * 1024  # 1024 images a request
stop = time.time() + 40


def load():
    while time.time() < stop and not done.is_set():
        try:
            c = http.client.HTTPConnection("127.0.0.1", hp, timeout=10)
            c.request("POST", "/predict", body=px, headers={"content-type": "application/octet-stream"})
            c.getresponse().read()
            c.close()
        except Exception:
            time.sleep(0.05)


done = threading.Event()
threads = [threading.Thread(target=load, daemon=True) for _ in range(12)]
for t in threads:
    t.start()
folder = max(glob.glob("/tmp/cgserve-metrics-*"), key=os.path.getmtime)  # this server's: the newest
victim = None
while time.time() < stop and victim is None:
    for f in glob.glob(f"{folder}/gauge_livesum_*.db"):
        pid = int(f.rsplit("_", 1)[1][:-3])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        d = MmapedDict(f, read_mode=True)
        vals = {k: v for k, v, *_ in d.read_all_values() if "queue_depth" in k or "in_flight" in k}
        d.close()
        if any(v > 0 for v in vals.values()):
            victim = pid
            print("killing worker", pid, "with", {k[:80]: v for k, v in vals.items() if v})
            os.kill(pid, signal.SIGKILL)
            break
    time.sleep(0.01)
done.set()
for t in threads:
    t.join(timeout=15)
print("load stopped; waiting 10 s for the restarted worker")
time.sleep(10)
for _i in range(3):
    txt = urllib.request.urlopen(f"http://127.0.0.1:{hp}/metrics", timeout=10).read().decode()
    print(
        [
            line
            for line in txt.splitlines()
            if line.startswith(("cgserve_queue_depth_rows", "cgserve_in_flight_batches", "cgserve_device_in_flight"))
        ]
    )
    time.sleep(2)
print("expected: 0 everywhere once idle; a non-zero value is the dead worker's stale gauge, counted into KEDA's query")
