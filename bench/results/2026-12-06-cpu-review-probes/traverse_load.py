"""gRPC RepositoryModelLoad with a model_name that is a path: ModelControl._build fingerprints
<repository>/<name> (pathlib: an absolute name replaces the repository) with rglob + stat of every file
BEFORE checking the name is a model folder. Several at once fill asyncio's default executor; meanwhile a
repository index (also on that executor) waits.
usage: traverse_load.py GRPC_PORT HTTP_PORT [N] [PATH]"""

import os
import sys
import threading
import time
from pathlib import Path

import httpx
import tritonclient.grpc as g

gp, hp = int(sys.argv[1]), int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
path = sys.argv[4] if len(sys.argv) > 4 else "/usr"
res = []


def call(i):
    cl = g.InferenceServerClient(f"127.0.0.1:{gp}")
    t0 = time.time()
    try:
        cl.load_model(path + "/" * i, client_timeout=120)
        r = "ok"
    except Exception as e:
        r = str(e)[:150]
    res.append((round(time.time() - t0, 1), r))


ths = [threading.Thread(target=call, args=(i,)) for i in range(n)]
for t in ths:
    t.start()
time.sleep(1)
PIX = (Path(os.environ["ROOT"]) / "models/examples/ankle-boot.u8").read_bytes()
lat = []
with httpx.Client(timeout=30) as c:
    for _ in range(20):
        t1 = time.time()
        rr = c.post(
            f"http://127.0.0.1:{hp}/v1/models/beta/predict",
            content=PIX,
            headers={"content-type": "application/octet-stream"},
        )
        lat.append(round((time.time() - t1) * 1000))
        time.sleep(0.1)
print("predict latencies (ms) during the walks:", sorted(lat), "statuses", rr.status_code)
t0 = time.time()
r = httpx.post(f"http://127.0.0.1:{hp}/v2/repository/index", timeout=120)
print("index during the walks:", r.status_code, round(time.time() - t0, 1), "s")
t0 = time.time()
r = httpx.post(f"http://127.0.0.1:{hp}/v2/repository/models/beta/load", timeout=120)
print("load beta during the walks:", r.status_code, round(time.time() - t0, 1), "s")
for t in ths:
    t.join()
for x in res[:3]:
    print("traversal load:", x)
