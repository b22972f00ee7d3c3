"""The model's input from a staged batch: uint8 pixels cast to [0, 1], then (x − mean) / std.

Runs on the engine's device, inside the CUDA graph: the host ships 8-bit pixels and the cast and
the per-channel normalisation cost a fused elementwise kernel or two, not host time.
"""

from __future__ import annotations

import torch
from torch import nn


class ModelInput(nn.Module):
    mean: torch.Tensor | None  # (1, C, 1, 1) fp32, or None where the model normalises itself
    std: torch.Tensor | None

    def __init__(self, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> None:
        super().__init__()
        self.register_buffer("mean", _per_channel(mean))
        self.register_buffer("std", _per_channel(std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, C, H, W) uint8 pixels 0–255 or float32 intensities in [0, 1] → (B, C, H, W) fp32
        if x.dtype == torch.uint8:
            x = x.float() * (1 / 255)  # the same float32 product as numpy's u8 * float32(1/255)
        if self.mean is not None:
            x = x - self.mean
        if self.std is not None:
            x = x / self.std
        return x


def _per_channel(values: tuple[float, ...] | None) -> torch.Tensor | None:
    return None if values is None else torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)
