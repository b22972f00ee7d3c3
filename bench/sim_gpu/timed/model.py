"""A stand-in for ResNet-50 on the H200 whose batch takes the GPU's time, slept, not computed.

On the H200 a ResNet-50 batch of b images took about 0.58 + 0.042·b ms (623 µs at 1, 5,987 µs at
128: bench/results/2026-11-30-run9-engine-compare-resnet50.json). Here a batch sleeps ten times
that, so that on a laptop's cores the device stays the bottleneck, as there, while the server's
processes and the load generator share the CPU: batching and the engine-process link can be
studied on a CPU machine (bench/results/2026-12-01-cpu-sim-gpu-frames.md). The sleep releases
the GIL and the eager engine runs batches one at a time on its own thread, as a GPU stream would.
"""

import time

import torch

FIXED_S, PER_ROW_S = 10 * 0.58e-3, 10 * 0.042e-3


class TimedBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 28, 28) → (B, 10)
        time.sleep(FIXED_S + PER_ROW_S * x.shape[0])
        return x.flatten(1)[:, :10]


def build() -> torch.nn.Module:
    return TimedBatch().eval()
