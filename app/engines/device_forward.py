"""What one batch computes on the device, from staged pixels to fp32 logits, as one module.

    x (b, C, H, W) uint8 pixels or fp32 intensities
      → ModelInput: /255 for pixels, (x − mean) / std            fp32
      → channels_last where asked
      → the model, under autocast in fp16/bf16
      → logits (b, classes) fp32, or its named outputs packed into (b, width) fp32 (app/engines/postprocess.py)

One module so that, with compile on, inductor sees the normalisation and the model together:
the cast and the per-channel arithmetic fuse into one kernel (with the layout change) instead of
two or three eager kernels in every graph (bench/engine_bench.py measures it on its own).
"""

from __future__ import annotations

import torch
from torch import nn

from app.engines.model_input import ModelInput
from app.engines.postprocess import packed
from app.repository.outputs import OutputLayout

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class DeviceForward(nn.Module):
    def __init__(
        self, model_input: ModelInput, module: nn.Module, *, dtype: str, channels_last: bool, layout: OutputLayout
    ) -> None:
        super().__init__()
        self.layout = layout
        self.model_input = model_input
        self.module = module
        self.dtype = dtype
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.model_input(x)  # (b, C, H, W) fp32
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        # cache_enabled=False: weight casts must be captured into each graph, not cached outside it.
        with torch.autocast("cuda", dtype=DTYPES[self.dtype], enabled=self.dtype != "fp32", cache_enabled=False):
            returned = self.module(x)  # (b, classes), or a tuple or dict of named outputs
        return packed(returned, self.layout, x.shape[0])  # (b, width) fp32, or ModelOutputError
