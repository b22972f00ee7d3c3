"""P6: load/unload cycles (memory), a slow factory, unload during load, a hung factory, and os._exit at load,
while a good model serves traffic.  usage: p6_lifecycle.py PORT WORKERS ENGINE_PROCESS"""
import sys, threading, subprocess; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import brokens
port, workers, ep = int(sys.argv[1]), sys.argv[2], sys.argv[3]
repo = fresh_repo(f"p6-{workers}-{ep}")
good_model(repo)
s = Server(repo, port, WORKERS=workers, ENGINE_PROCESS=ep, MODEL_CONTROL="explicit", REQUEST_TIMEOUT_S=2)
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
                k = type(e).__name__; stats["err"][k] = stats["err"].get(k, 0) + 1; time.sleep(0.2)
            time.sleep(0.01)
def rss():
    pids = subprocess.run(["pgrep", "-g", str(s.proc.pid)], capture_output=True, text=True).stdout.split()
    tot = 0
    for p in pids:
        try: tot += int(open(f"/proc/{p}/status").read().split("VmRSS:")[1].split()[0])
        except Exception: pass
    return tot // 1024
t = threading.Thread(target=traffic); t.start()
ctl = lambda name, op, timeout=120: httpx.post(f"{s.url}/v2/repository/models/{name}/{op}", timeout=timeout)
# a) cycles
for name in ("onnx-ok", "py-huge-output"):
    d = repo / name; d.mkdir(); brokens.B[name](d)
for name in ("onnx-ok", "py-huge-output"):
    before = rss()
    for i in range(12):
        r1 = ctl(name, "load"); predict(s.url, name, u8(4)); r2 = ctl(name, "unload")
        if r1.status_code != 200 or r2.status_code != 200: print("cycle", i, r1.status_code, r1.text[:200], r2.status_code)
        if i in (0, 5, 11): time.sleep(2.5); print(f"{name} cycle {i}: rss {rss()} MB (before {before})", flush=True)
print("stats so far", stats)
# b) slow factory + unload during its load
slow = repo / "slowload"; slow.mkdir()
brokens.pymodel(slow, "import time\n" + __import__("models_runtime").body("return y").replace("def build():\n    return Net()", "def build():\n    time.sleep(15)\n    return Net()"))
res = {}
def do_load(): 
    try: res["load"] = ctl("slowload", "load", 60)
    except Exception as e: res["load"] = e
lt = threading.Thread(target=do_load); lt.start(); time.sleep(2)
t0 = time.time(); r = ctl("slowload", "unload", 60); print(f"unload during load: {r.status_code} {r.text[:200]} after {time.time()-t0:.1f}s")
lt.join(); L = res["load"]; print("the load:", getattr(L, "status_code", L), getattr(L, "text", "")[:200])
idx = httpx.post(f"{s.url}/v2/repository/index").json(); print("index:", [(m["name"], m.get("state")) for m in idx])
print("slowload predict:", predict(s.url, "slowload", u8(1)).status_code)
# c) hung factory: does the load call ever answer, does the server still serve, can it be stopped
hung = repo / "hung"; hung.mkdir()
brokens.pymodel(hung, "def build():\n    while True:\n        pass\n")
try:
    r = ctl("hung", "load", 8); print("hung load answered:", r.status_code, r.text[:200])
except Exception as e:
    print("hung load: client timeout after 8 s:", type(e).__name__)
time.sleep(3)
print("stats during hung load", stats)
r = None
try:
    d2 = repo / "onnx-ok"; r = ctl("onnx-ok", "load", 20); print("another model's load while hung one loads:", r.status_code, r.text[:100])
except Exception as e: print("another model's load while hung one loads: EXC", type(e).__name__)
# d) os._exit in a factory
ex = repo / "exits"; ex.mkdir(); brokens.pymodel(ex, "import os\ndef build():\n    os._exit(0)\n")
try: r = ctl("exits", "load", 20); print("os._exit load:", r.status_code, r.text[:200])
except Exception as e: print("os._exit load: EXC", type(e).__name__)
time.sleep(3)
print("alive after os._exit load:", s.proc.poll() is None, s.proc.returncode)
stop.set(); t.join()
print("good traffic:", stats)
t0 = time.time(); s.stop(); print(f"stopped in {time.time()-t0:.1f}s rc={s.proc.returncode}")
print("\n".join(l[:250] for l in s.logtext().splitlines() if "CRITICAL" in l or "ERROR" in l or "exit" in l.lower())[:3000])
