"""P2: a model that returns 1 row for a batch of 4+: do the other rows carry a previous batch's answers?"""
import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import models_runtime as M
import numpy as np
port = int(sys.argv[1]) if len(sys.argv) > 1 else 18602
workers = sys.argv[2] if len(sys.argv) > 2 else "1"; ep = sys.argv[3] if len(sys.argv) > 3 else "false"
repo = fresh_repo(f"p2-{workers}-{ep}")
# returns 1 row for B >= 4, but for B == 8 returns the real rows (so a bucket-8 batch fills the slot first)
body = M.body("if B == 4:\n    return y[:1]")
py_model(repo, "m-softmax", body, "")
py_model(repo, "m-sigmoid", body, 'postprocess = "sigmoid"\n')
s = Server(repo, port, WORKERS=workers, ENGINE_PROCESS=ep, IN_FLIGHT=1)
print("ready", s.wait_ready(120, "/readyz"))
for m in ("m-softmax", "m-sigmoid"):
    # 1) another client's batch of 5 (bucket 8) fills the slot with its answers
    a = predict(s.url, m, u8(5, seed=123)).json()["predictions"]
    # 2) this client's batch of 3 (bucket 4): the model returns one row
    b = predict(s.url, m, u8(3, seed=7)).json()["predictions"]
    print(m)
    for i in range(3):
        print("  earlier client's row", i, np.round(a[i]["scores"][:4], 5), a[i]["label"])
    for i in range(3):
        print("  this request's row  ", i, np.round(b[i]["scores"][:4], 5), b[i]["label"])
    print("  rows 1,2 of this request identical to the earlier client's rows 1,2:",
          all(b[i]["scores"] == a[i]["scores"] for i in (1, 2)))
s.stop()
print([l for l in s.logtext().splitlines() if "warn" in l.lower()][:5])
