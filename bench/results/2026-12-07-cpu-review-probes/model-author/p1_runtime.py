"""P1: Python models that misbehave only for some batch sizes, against one real server (one worker by default)."""
import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import models_runtime as M
import numpy as np, torch

workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
engine_process = sys.argv[2] if len(sys.argv) > 2 else "false"
port = int(sys.argv[3]) if len(sys.argv) > 3 else 18601
repo = fresh_repo(f"p1-{workers}-{engine_process}")
good_model(repo)
cases = {
    "squeeze": (M.SQUEEZE, ""), "bcast": (M.BCAST, ""), "bcast-none": (M.BCAST, 'postprocess = "none"\n'),
    "bcast-sig": (M.BCAST, 'postprocess = "sigmoid"\n'), "raise4": (M.RAISE4, ""), "nan": (M.NAN, ""),
    "nan-none": (M.NAN, 'postprocess = "none"\n'), "inf": (M.INF, ""), "inf-none": (M.INF, 'postprocess = "none"\n'),
    "dict1": (M.DICT1, ""), "tuple1": (M.TUPLE1, ""), "extra-rows": (M.EXTRA_ROWS, ""),
    "extra-rows-none": (M.EXTRA_ROWS, 'postprocess = "none"\n'),
    "int64": (M.INT64, 'postprocess = "none"\n'), "bool": (M.BOOL, 'postprocess = "none"\n'),
}
for name, (body, extra) in cases.items():
    py_model(repo, name, body, extra)
s = Server(repo, port, WORKERS=workers, ENGINE_PROCESS=engine_process)
ok = s.wait_ready(180, "/readyz")
print("ready:", ok)
if not ok:
    print(s.logtext()[-3000:]); s.stop(); sys.exit()

g = torch.Generator().manual_seed(1); W = torch.randn(784, 10, generator=g)
def expected(imgs, post):
    y = torch.from_numpy(imgs.reshape(len(imgs), -1).astype(np.float32) * np.float32(1/255)) @ W
    return {"softmax": torch.softmax(y, 1), "sigmoid": torch.sigmoid(y), "none": y}[post].numpy()

for name in cases:
    post = "none" if "none" in name or name in ("int64", "bool") else ("sigmoid" if "sig" in name else "softmax")
    for n in (1, 3, 5):
        imgs = u8(n, seed=n)
        r = predict(s.url, name, imgs)
        line = f"{name:16s} n={n} -> {r.status_code} "
        if r.status_code == 200:
            try:
                got = np.array([p["scores"] for p in r.json()["predictions"]], dtype=np.float64)
                if name in ("int64", "bool"):
                    line += f"scores[0]={got[0].tolist()}"
                else:
                    exp = expected(imgs, post)
                    same = np.allclose(got, exp, rtol=1e-3, atol=1e-5, equal_nan=True)
                    line += f"matches-expected={same}"
                    if not same:
                        line += f" got[:,0]={got[:,0].round(4).tolist()} exp[:,0]={exp[:,0].round(4).tolist()}"
            except Exception as e:
                line += f"body not JSON/parse error {type(e).__name__}: {r.text[:200]!r}"
        else:
            line += r.text[:300]
        print(line)
# the good model afterwards
imgs = u8(5, seed=99)
r = predict(s.url, "good", imgs); print("good after:", r.status_code, r.text[:80])
print("alive:", s.proc.poll() is None)
s.stop()
log = s.logtext()
print("---- log excerpt (Traceback count %d) ----" % log.count("Traceback"))
print("\n".join(l for l in log.splitlines() if "ERROR" in l or "failed" in l or "CRITICAL" in l)[:4000])
