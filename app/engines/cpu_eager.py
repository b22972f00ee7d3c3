"""Eager PyTorch on the CPU: the embedded default that runs on any machine.

The forward runs on one worker thread, so the event loop keeps decoding and batching while
a batch computes (torch releases the GIL inside its kernels), and batches never overlap.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn

from app.engines.base import Slot
from app.model_spec import ModelSpec


class CpuEagerEngine:
    name = "eager"
    device = "cpu"

    def __init__(self, module: nn.Module, spec: ModelSpec, buckets: tuple[int, ...]) -> None:
        self.module = module.eval()
        self.spec = spec
        self.buckets = buckets
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-eager")

    def new_slot(self) -> Slot:
        max_bucket = self.buckets[-1]
        return Slot(
            inputs=np.zeros((max_bucket, *self.spec.input_shape), dtype=np.float32),
            outputs=np.zeros((max_bucket, self.spec.num_classes), dtype=np.float32),
        )

    async def run(self, slot: Slot, bucket: int) -> float:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._forward, slot, bucket)

    def _forward(self, slot: Slot, bucket: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            # from_numpy shares memory: (bucket, C, H, W) in, (bucket, classes) written in place.
            logits = self.module(torch.from_numpy(slot.inputs[:bucket]))
            torch.softmax(logits, dim=1, out=torch.from_numpy(slot.outputs[:bucket]))
        return time.perf_counter() - start

    def healthy(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {"dtype": "fp32", "threads": torch.get_num_threads()}

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
