"""Eager PyTorch on the CPU: the embedded default that runs on any machine.

The forward runs on one worker thread, so the event loop keeps decoding and batching while
a batch computes (torch releases the GIL inside its kernels), and batches never overlap.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from app.engines.base import EngineReport, InputDtype, Slot, host_slot
from app.engines.model_input import ModelInput
from app.engines.postprocess import finished_into, packed
from app.ops.daemon_thread import at_work
from app.repository.model_spec import ModelSpec


class CpuEagerEngine:
    device = "cpu"

    def __init__(
        self, module: nn.Module, spec: ModelSpec, buckets: tuple[int, ...], *, in_flight: int = 2, name: str = "eager"
    ) -> None:
        started = time.perf_counter()
        self.name = name
        self.module = module  # in eval mode already (app/repository/loaders.py)
        self.model_input = ModelInput(spec.preprocess.mean, spec.preprocess.std)
        self.spec = spec
        self.buckets = buckets
        self.slots = tuple(host_slot(i, buckets[-1], spec.input_shape, spec.layout.width) for i in range(in_flight))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-eager")
        self.report = EngineReport(
            facts={"dtype": "fp32", "threads": torch.get_num_threads(), "postprocess": spec.config.postprocess}
        )
        self.report.startup_seconds = time.perf_counter() - started

    async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._forward, slot.inputs[dtype][:bucket], slot.outputs)

    def _forward(self, inputs: np.ndarray, outputs: np.ndarray) -> float:
        start = time.perf_counter()
        bucket = len(inputs)
        with at_work(), torch.inference_mode():  # a forward stuck in the model's code does not hold a stop
            # from_numpy shares memory: (bucket, C, H, W) in, (bucket, width) written in place: the class
            # scores, or every named output packed into one float32 row an image.
            rows = packed(self.module(self.model_input(torch.from_numpy(inputs))), self.spec.layout, bucket)
            out = torch.from_numpy(outputs[:bucket])
            finished_into(rows, self.spec.layout, self.spec.config.postprocess, out)
        return time.perf_counter() - start

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        # Not waited for: the batcher has waited for its batches, and one still running is stuck in the model's code.
        self._executor.shutdown(wait=False, cancel_futures=True)
