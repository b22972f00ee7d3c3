"""Python model bodies that misbehave only at serving time (the load probe runs batch 2, and 3 with [[outputs]])."""
BASE = '''
import torch, sys, os, time
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = nn.Parameter(torch.randn(784, 10, generator=g))
    def logits(self, x):
        return x.reshape(x.shape[0], -1) @ self.w
    def forward(self, x):
        y = self.logits(x)
        B = x.shape[0]
%s
        return y
def build():
    return Net()
'''
def body(snippet):
    return BASE % "\n".join("        " + l for l in snippet.strip().splitlines())

SQUEEZE = body("return y.squeeze()")                      # (10,) for batch 1
BCAST = body("if B >= 4:\n    return y[:1]")               # 1 row for a 4+ batch
BCAST_NONE = BCAST
RAISE4 = body("if B >= 4:\n    raise ValueError(f'this model cannot do a batch of {B}')")
NAN = body("return torch.full_like(y, float('nan')) if B == 1 else y")
INF = body("return torch.full_like(y, float('inf')) if B == 1 else y")
DICT1 = body("if B == 1:\n    return {'logits': y}")
TUPLE1 = body("if B == 1:\n    return (y, y)")
EXTRA_ROWS = body("if B == 1:\n    return torch.cat([y, y])")
INT64 = body("return torch.nn.functional.one_hot(y.argmax(1), 10)")
BOOL = body("return y > 0")
SYSEXIT = body("if B == 1:\n    sys.exit(3)")
OSEXIT = body("if B == 1:\n    os._exit(7)")
SLOW = body("if B == 1:\n    time.sleep(float(os.environ.get('SLOW_S', '12')))")
PRINTS = body("print('x' * 200000, flush=True)")
LEAK = body("globals().setdefault('KEEP', []).append(torch.empty(4_000_000))\nreturn y")
KBINT = body("if B == 1:\n    raise KeyboardInterrupt")
SYSEXIT0 = body("if B == 1:\n    sys.exit(0)")
SYSEXIT1 = body("if B == 1:\n    sys.exit(1)")
