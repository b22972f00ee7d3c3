"""A model whose forward blocks while a flag file exists (STUCK_FLAG env or default), and optionally
sleeps forever (no way out) when MODE file says 'forever'."""
import os, time, torch
from torch import nn

FLAG = os.environ.get("STUCK_FLAG", "/tmp/rev62-stuck.flag")

class Stuck(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 3)
    def forward(self, x):
        while os.path.exists(FLAG):
            if open(FLAG).read().strip() == "forever":
                while True:
                    time.sleep(3600)
            time.sleep(0.05)
        return self.lin(x.reshape(x.shape[0], -1))

def build():
    torch.manual_seed(0)
    return Stuck()
