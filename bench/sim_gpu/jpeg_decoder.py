"""The GPU JPEG decoder's stand-in for a machine without one: its batching and its H200 times ×10, slept.

app/codecs/gpu_jpeg.py's structure, kept: uploads queue; a collector takes everything waiting (up to `max_batch`)
as soon as fewer than `launches` batches are being launched (and, having taken every one, calls `on_caught_up`, as the
front door's pacing needs); a launch runs on a worker thread, its decode under one
lock for the process (torchvision's decoder lock); the batch's resize and copy out then run beside the next launch;
the event loop hands the rows back, copying each into the caller's `out`. The times are a batch's on the H200 ×10
(bench/results/HISTORY.md, runs 30c and 40a: nvJPEG's decode of 128 photos ~9 ms beside a busy device, its
preparation ~2.4 ms, resize and copy out ~3.6), as bench/sim_gpu/timed's ResNet-50 is: so that on a laptop's two
cores the decoder and the device stay the bottlenecks while the server and the load generator share the CPU, and
the paths that feed them can be compared there. The pixels are a grey image, not the photo's: no answer is checked.
With CGSERVE_JPEG_NVJPEG=direct the decodes take no lock, as the direct decoder's states do not (the H200's
direct decoder is not otherwise modelled: its host time grew with its threads there, run 40b).

    python3 -m bench.sim_gpu.serve serve --device cpu --model-repository bench/sim_gpu/timed_photos/.. ...
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from app.config import JPEG_LAUNCHES

SCALE = 10
PREPARE_S = SCALE * 0.019e-3  # a photo: the batch's host work outside the decoder lock
DECODE_FIXED_S, DECODE_S = SCALE * 1.0e-3, SCALE * 0.0625e-3  # a batch, a photo: under the lock
DEVICE_FIXED_S, DEVICE_S = SCALE * 0.5e-3, SCALE * 0.024e-3  # resize and copy out: a batch, a photo


@dataclass(eq=False)
class _Job:
    future: asyncio.Future[np.ndarray]
    out: np.ndarray | None


class TimedJpegDecoder:
    def __init__(self, shape: tuple[int, int, int], *, max_batch: int = 128, launches: int = 0,
                 nvjpeg: str = "torchvision") -> None:  # fmt: skip
        self.max_batch = max_batch
        self.launches = launches = launches or JPEG_LAUNCHES[nvjpeg]  # 0: the real decoder's count (the settings')
        self.pixels = np.full((1, *shape), 128, np.uint8)  # (1, C, h, w): what each upload decodes to
        self.nvjpeg = f"simulated {nvjpeg}"
        # torchvision's decoder lock: one decode at a time in the process; the direct decoder (CGSERVE_JPEG_NVJPEG=
        # direct) has a state a launch, so none: its batches decode at once, each in its own time.
        self._lock: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if nvjpeg == "torchvision" else contextlib.nullcontext()
        )
        self._worker = ThreadPoolExecutor(max_workers=launches, thread_name_prefix="sim-jpeg")
        self._slots = asyncio.Semaphore(launches)
        self._pending: list[_Job] = []
        self._arrived = asyncio.Event()
        self._collector: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self.on_caught_up: Callable[[], None] | None = None  # as GpuJpegDecoder's: the front door's pacing

    def backlog(self) -> int:
        return len(self._pending)

    def decode(self, data: object, spec: object, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        if self._collector is None:
            self._collector = asyncio.create_task(self._collect())
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(future, out))
        self._arrived.set()
        return future

    def close(self) -> None:
        if self._collector is not None:
            self._collector.cancel()
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def _collect(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._pending:
                await self._slots.acquire()
                jobs = [job for job in self._pending[: self.max_batch] if not job.future.done()]
                del self._pending[: self.max_batch]
                if not self._pending and self.on_caught_up is not None:
                    asyncio.get_running_loop().call_soon(self.on_caught_up)
                task = asyncio.create_task(self._batch(jobs))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _batch(self, jobs: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, self._launch, len(jobs))
        finally:
            self._slots.release()
        await asyncio.sleep(DEVICE_FIXED_S + DEVICE_S * len(jobs))  # on the device, beside the next launch
        for job in jobs:  # handed back in one turn of the loop, as the decoder's event completes
            if job.future.done():
                continue
            if job.out is not None:
                np.copyto(job.out, self.pixels)
                job.future.set_result(job.out)
            else:
                job.future.set_result(self.pixels.copy())

    def _launch(self, n: int) -> None:
        time.sleep(PREPARE_S * n)
        with self._lock:
            time.sleep(DECODE_FIXED_S + DECODE_S * n)
