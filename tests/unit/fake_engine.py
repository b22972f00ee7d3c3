"""An engine for batcher tests: no model, every output row a function of its own input row.

Row i of a batch answers [v, 2v, 3v] where v is the mean of input row i, so a test that gives
each request its own constant image can check that every request got its own rows back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from app.engines.base import EngineReport, InputDtype, Slot, host_slot

SHAPE = (1, 2, 2)  # (C, H, W) of one tiny image
CLASSES = 3


def images(*values: float) -> np.ndarray:
    """(len(values), 1, 2, 2) float32, image i filled with values[i]."""
    return np.stack([np.full(SHAPE, v, dtype=np.float32) for v in values])


def expected(*values: float) -> np.ndarray:
    return np.array([[v, 2 * v, 3 * v] for v in values], dtype=np.float32)


class FakeEngine:
    name = "fake"

    def __init__(
        self,
        buckets: tuple[int, ...] = (1, 2, 4, 8),
        *,
        poison: float | None = None,
        in_flight: int = 2,
        device: str = "cpu",
        sticky: bool = False,
        seconds: float | Callable[[int], float] = 0.001,  # or bucket → seconds
    ) -> None:
        self.buckets = buckets
        self.device = device
        self.sticky = sticky  # a poisoned batch breaks the device for good, as a CUDA error does
        self.broken = False
        self.slots = tuple(host_slot(i, buckets[-1], SHAPE, CLASSES) for i in range(in_flight))
        self.report = EngineReport()
        self.poison = poison  # a batch holding this value fails
        self.seconds = seconds  # the device time each batch reports, the same for every bucket or by bucket
        self.launches: list[tuple[int, np.ndarray]] = []  # (bucket, a copy of the real+padding inputs)
        self.gate = asyncio.Event()  # closed: run() waits, as a busy device would
        self.gate.set()
        self.launched = asyncio.Event()
        self.dtypes: list[InputDtype] = []  # the staging dtype of each launch
        self.used_slots: list[Slot] = []  # the slot of each launch

    async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
        batch = slot.inputs[dtype][:bucket].astype(np.float32)  # a copy, as real and padding rows stood
        if dtype == "uint8":
            batch *= np.float32(1 / 255)
        self.launches.append((bucket, batch))
        self.dtypes.append(dtype)
        self.used_slots.append(slot)
        self.launched.set()
        await self.gate.wait()
        if self.poison is not None and (batch == self.poison).any():
            self.broken = self.sticky
            raise RuntimeError("poisoned batch")
        means = batch.reshape(bucket, -1).mean(axis=1)
        slot.outputs[:bucket] = means[:, None] * np.array([1, 2, 3], dtype=np.float32)
        return self.seconds(bucket) if callable(self.seconds) else self.seconds

    def launched_values(self) -> list[list[float]]:
        """Per launch, the first pixel of every row (padding included)."""
        return [batch[:, 0, 0, 0].tolist() for _, batch in self.launches]

    def healthy(self) -> bool:
        return not self.broken

    def close(self) -> None:
        pass
