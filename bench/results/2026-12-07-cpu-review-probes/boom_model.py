import torch


class Boom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(50_000_000))  # 200 MB

    def forward(self, x):
        raise RuntimeError("boom at warm-up")


def build():
    return Boom()
