"""A model whose behaviour at serving time follows the file MOODY_FILE (default /tmp/rev62-moody.mode):
ok | exit | kbd | gen | squeeze | list | nan | sleep:N."""
import os, sys, time, torch
from torch import nn

MODE = os.environ.get("MOODY_FILE", "/tmp/rev62-moody.mode")

class Moody(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 3)
    def forward(self, x):
        mode = open(MODE).read().strip() if os.path.exists(MODE) else "ok"
        y = self.lin(x.reshape(x.shape[0], -1))
        if mode == "exit":
            sys.exit(3)
        if mode == "kbd":
            raise KeyboardInterrupt("from the model")
        if mode == "gen":
            raise GeneratorExit("from the model")
        if mode == "cancel":
            import concurrent.futures as cf
            f = cf.Future(); f.cancel(); f.result()  # a cancelled inner future: CancelledError, a BaseException
        if mode == "squeeze":
            return y[:1].squeeze(0)
        if mode == "rows":
            return y[:1]
        if mode.startswith("sleep:"):
            time.sleep(float(mode[6:]))
        return y

def build():
    torch.manual_seed(0)
    return Moody()
