"""P5: model control (explicit): load each broken model via the API while a good model serves traffic.
usage: p5_control.py PORT WORKERS ENGINE_PROCESS [names...]"""
import sys, threading, os; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import brokens
port, workers, ep = int(sys.argv[1]), sys.argv[2], sys.argv[3]
names = sys.argv[4:] or list(brokens.B)
repo = fresh_repo(f"p5-{workers}-{ep}")
good_model(repo)
s = Server(repo, port, WORKERS=workers, ENGINE_PROCESS=ep, MODEL_CONTROL="explicit")
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
t = threading.Thread(target=traffic); t.start()
def rss():
    import subprocess
    out = subprocess.run(["ps", "-o", "rss=", "--ppid", str(s.proc.pid), "-p", str(s.proc.pid)], capture_output=True, text=True).stdout
    pids = subprocess.run(["pgrep", "-g", str(s.proc.pid)], capture_output=True, text=True).stdout.split()
    tot = 0
    for p in pids:
        try: tot += int(open(f"/proc/{p}/status").read().split("VmRSS:")[1].split()[0])
        except Exception: pass
    return tot // 1024
print("rss MB at start", rss())
for name in names:
    d = repo / name
    d.mkdir()
    try:
        brokens.B[name](d)
    except Exception as e:
        print(f"{name}: setup failed {e!r}"); continue
    t0 = time.time()
    try:
        r = httpx.post(f"{s.url}/v2/repository/models/{name}/load", timeout=120)
        res = f"{r.status_code} {r.text[:600]}"
    except Exception as e:
        res = f"EXC {type(e).__name__} {e}"
    extra = ""
    if res.startswith("200"):
        try:
            rr = predict(s.url, name, u8(3, seed=1), timeout=20); extra = f" | predict n=3: {rr.status_code} {rr.text[:200]}"
            rr = predict(s.url, name, u8(1, seed=1), timeout=20); extra += f" | n=1: {rr.status_code} {rr.text[:160]}"
        except Exception as e:
            extra = f" | predict EXC {type(e).__name__}"
    alive = s.proc.poll() is None
    print(f"### {name} ({time.time()-t0:.1f}s) alive={alive} rss={rss()}MB\n    {res}{extra}", flush=True)
    if not alive:
        break
try:
    idx = httpx.post(f"{s.url}/v2/repository/index", timeout=10).json()
    print("index:", [(m["name"], m.get("state"), (m.get("reason") or "")[:60]) for m in idx])
except Exception as e:
    print("index EXC", e)
time.sleep(1)
stop.set(); t.join()
print("good-model traffic:", stats)
print("alive at end:", s.proc.poll() is None)
s.stop()
