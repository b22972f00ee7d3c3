"""Does dynamo trace postprocess.packed (with its shape checks) in one graph (fullgraph=True)?"""
import torch, torch._dynamo
from app.engines.postprocess import packed, finished
from app.repository.outputs import OutputLayout

default = OutputLayout.scores(10)
named = OutputLayout.of([("logits", (10,), "FP32", True), ("emb", (4, 2), "FP32", False), ("count", (), "INT64", False)])

def f_default(x):
    return finished(packed(x @ torch.ones(8, 10), default, x.shape[0]), default, "softmax")

def f_tuple(x):
    out = (x @ torch.ones(8, 10), (x @ torch.ones(8, 8)).reshape(x.shape[0], 4, 2), x.sum(1).long())
    return finished(packed(out, named, x.shape[0]), named, "softmax")

def f_list(x):
    out = [x @ torch.ones(8, 10), (x @ torch.ones(8, 8)).reshape(x.shape[0], 4, 2), x.sum(1).long()]
    return finished(packed(out, named, x.shape[0]), named, "softmax")

def f_dict(x):
    out = {"emb": (x @ torch.ones(8, 8)).reshape(x.shape[0], 4, 2), "logits": x @ torch.ones(8, 10), "count": x.sum(1).long()}
    return finished(packed(out, named, x.shape[0]), named, "softmax")

for fn in (f_default, f_tuple, f_list, f_dict):
    for dynamic in (False, True):
        torch._dynamo.reset()
        try:
            c = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend="eager")
            for b in (2, 4):
                y = c(torch.rand(b, 8))
            print(fn.__name__, "dynamic" if dynamic else "static", "ok", tuple(y.shape))
        except Exception as e:
            print(fn.__name__, "dynamic" if dynamic else "static", "FAIL", type(e).__name__, str(e)[:1500])
# bad shape raises under compile?
torch._dynamo.reset()
def f_bad(x):
    return packed(x @ torch.ones(8, 10), named, x.shape[0])
try:
    torch.compile(f_bad, fullgraph=True, backend="eager")(torch.rand(2, 8))
except Exception as e:
    print("bad:", type(e).__name__, str(e).splitlines()[0][:200])
