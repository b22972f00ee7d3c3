import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
repo = fresh_repo("t0"); good_model(repo)
s = Server(repo, 18600)
t=time.time(); print(s.wait_ready(), time.time()-t)
r = predict(s.url, "good", u8(3)); print(r.status_code, r.text[:300])
print(httpx.get(s.url+"/readyz").text)
s.stop(); print(s.logtext()[-2000:])
