"""P8: the good model's latency while other models load (explicit control).  usage: p8_latency.py PORT WORKERS EP"""
import sys, threading, statistics; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import brokens, models_runtime as M
port, workers, ep = int(sys.argv[1]), sys.argv[2], sys.argv[3]
repo = fresh_repo(f"p8-{workers}-{ep}")
good_model(repo)
s = Server(repo, port, WORKERS=workers, ENGINE_PROCESS=ep, MODEL_CONTROL="explicit")
print("ready", s.wait_ready(180, "/readyz"))
lat = []; errs = []
stop = threading.Event()
def traffic():
    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            r = c.post(f"{s.url}/v1/models/good/predict", content=u8(1, seed=5).tobytes(), headers={"content-type": "application/octet-stream"})
            lat.append((time.time(), time.perf_counter() - t0))
            if r.status_code != 200: errs.append(r.status_code)
            time.sleep(0.005)
t = threading.Thread(target=traffic); t.start()
time.sleep(2)
def window(label, fn):
    a = time.time(); out = fn(); b = time.time()
    xs = [l for (ts, l) in lat if a <= ts <= b + 0.5]
    print(f"{label}: {out} load {b-a:.1f}s; good requests {len(xs)}, p50 {statistics.median(xs)*1e3:.1f} ms, max {max(xs)*1e3:.0f} ms", flush=True)
window("idle", lambda: time.sleep(2) or "")
big = '''
import torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(24)])   # ~100M params
        self.head = nn.Linear(784, 10)
    def forward(self, x):
        return self.head(x.reshape(x.shape[0], -1))
def build():
    return Net()
'''
for name, setup in [("onnx-ok", brokens.B["onnx-ok"]), ("py-huge-output", brokens.B["py-huge-output"]),
                    ("big-init", lambda d: brokens.pymodel(d, big))]:
    d = repo / name; d.mkdir(); setup(d)
    window(f"load {name}", lambda: httpx.post(f"{s.url}/v2/repository/models/{name}/load", timeout=120).status_code)
    window(f"unload {name}", lambda: httpx.post(f"{s.url}/v2/repository/models/{name}/unload", timeout=120).status_code)
stop.set(); t.join(); print("errors:", errs[:10], len(errs))
s.stop()
