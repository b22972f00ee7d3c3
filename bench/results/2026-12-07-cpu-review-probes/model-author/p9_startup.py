"""P9: start-up (no model control) with one model folder each; how does the server start or refuse?"""
import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import brokens
port = 18620
for name in sys.argv[1:]:
    repo = fresh_repo(f"p9-{name}"); good_model(repo)
    d = repo / name; d.mkdir(); brokens.B[name](d)
    s = Server(repo, port); port += 1
    ok = s.wait_ready(60, "/readyz")
    line = f"### {name}: ready={ok} rc={s.proc.poll()}"
    if ok:
        r = predict(s.url, name, u8(1)); line += f" predict: {r.status_code} {r.text[:200]}"
    s.stop()
    print(line); print("   log:", "\n        ".join(l[:300] for l in s.logtext().splitlines() if "INFO" not in l)[:1500])
