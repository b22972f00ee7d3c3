"""P3: NaN/inf scores: what bytes does the client get (JSON /predict and v2 JSON)?"""
import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import models_runtime as M, json as J
repo = fresh_repo("p3")
py_model(repo, "nan", M.NAN, 'postprocess = "none"\n')
py_model(repo, "inf", M.INF, '')
s = Server(repo, 18603)
print("ready", s.wait_ready(120, "/readyz"))
for m in ("nan", "inf"):
    r = predict(s.url, m, u8(1)); print(m, "/predict", r.status_code, r.text[:200])
    try: J.loads(r.text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))); print("  strict JSON ok")
    except Exception as e: print("  NOT strict JSON:", e)
    body = {"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8", "data": u8(1).ravel().tolist()}]}
    r = httpx.post(f"{s.url}/v2/models/{m}/infer", json=body); print(m, "v2", r.status_code, r.text[:200])
s.stop()
