"""P4: a model that exits / interrupts / is slow at serving time (batch 1 only), beside a good model under traffic.
usage: p4_fatal.py CASE PORT WORKERS ENGINE_PROCESS"""
import sys, threading; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import models_runtime as M
case, port, workers, ep = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
extra_env = dict(a.split("=", 1) for a in sys.argv[5:])
repo = fresh_repo(f"p4-{case}-{workers}-{ep}")
good_model(repo)
py_model(repo, "bad", getattr(M, case.upper()), "")
s = Server(repo, port, WORKERS=workers, ENGINE_PROCESS=ep, **extra_env)
print("ready", s.wait_ready(180, "/readyz"))
ref = predict(s.url, "good", u8(2, seed=5)).json()["predictions"]
stats = {"ok": 0, "wrong": 0, "err": {}}
stop = threading.Event()
def traffic():
    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            try:
                r = c.post(f"{s.url}/v1/models/good/predict", content=u8(2, seed=5).tobytes(),
                           headers={"content-type": "application/octet-stream"})
                if r.status_code == 200:
                    stats["ok" if r.json()["predictions"] == ref else "wrong"] += 1
                else:
                    k = f"{r.status_code} {r.text[:160]}"; stats["err"][k] = stats["err"].get(k, 0) + 1
            except Exception as e:
                k = type(e).__name__; stats["err"][k] = stats["err"].get(k, 0) + 1
                time.sleep(0.2)
t = threading.Thread(target=traffic); t.start()
time.sleep(1)
t0 = time.time()
try:
    r = predict(s.url, "bad", u8(1), timeout=40); print("bad request:", r.status_code, r.text[:300], f"{time.time()-t0:.1f}s")
except Exception as e:
    print("bad request: exception", type(e).__name__, e, f"{time.time()-t0:.1f}s")
time.sleep(4)
for i in range(3):
    try:
        r = predict(s.url, "bad", u8(2), timeout=15); print("bad model, batch 2 afterwards:", r.status_code, r.text[:150])
    except Exception as e:
        print("bad model batch 2 afterwards: exception", type(e).__name__)
time.sleep(6)
stop.set(); t.join()
print("good-model traffic during/after:", stats)
print("server alive:", s.proc.poll() is None, "rc", s.proc.returncode)
try: print("readyz:", httpx.get(s.url + "/readyz", timeout=3).text[:200])
except Exception as e: print("readyz:", type(e).__name__)
s.stop()
log = s.logtext()
print("---- log tail ----"); print("\n".join(log.splitlines()[-25:])[-3500:])
