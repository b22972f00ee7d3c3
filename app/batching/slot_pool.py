"""The batcher's free Slots across one engine per device, each batch to the least-loaded device.

Every engine owns its slots (a slot's pinned buffers, events and graphs belong to one device),
so a batch runs on the engine whose slot it was given. The collector waits until some slot is
free, forms its batch, and only then takes a slot, so that the choice sees the load of the
moment the batch launches: the device with the fewest rows in flight (bucket rows, padding
included: what the device computes), ties to the one that has launched fewer batches, so that
idle devices take turns. One engine, as on the CPU, is the plain case of the same pool.

Only the collector takes slots and only finished batches give them back, so a slot that
`wait_free` saw free is still free when `take` runs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from app.engines.base import Engine, Slot


@dataclass(slots=True, eq=False)
class Lease:
    """One batch's hold on one slot of one device's engine."""

    device: int  # index into SlotPool.engines
    engine: Engine
    slot: Slot
    rows: int  # the batch's bucket: rows the device computes


class SlotPool:
    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("a slot pool needs at least one engine")
        self.engines = tuple(engines)
        self._free = [deque(engine.slots) for engine in self.engines]  # per device: its engine's free slots
        self.rows_in_flight = [0] * len(self.engines)
        self.batches_in_flight = [0] * len(self.engines)
        self.launched = [0] * len(self.engines)  # batches ever taken, per device
        self._released = asyncio.Event()

    @property
    def size(self) -> int:
        """Slots of every device: the batches that can be in flight at once."""
        return sum(len(engine.slots) for engine in self.engines)

    def by_device(self, counts: list[int]) -> dict[str, int]:
        """Per-device counts (launched, batches_in_flight …) keyed by device name."""
        return {engine.device: n for engine, n in zip(self.engines, counts, strict=True)}

    def idle(self) -> bool:
        """Some device has no batch in flight (and so a free slot): a batch launched now waits for nothing."""
        return any(n == 0 and free for n, free in zip(self.batches_in_flight, self._free, strict=True))

    def free_devices(self) -> list[int]:
        """The devices that have a free slot now."""
        return [device for device, free in enumerate(self._free) if free]

    async def wait_free(self) -> None:
        """Return once some device has a free slot."""
        while not any(self._free):
            self._released.clear()
            await self._released.wait()

    def take(self, rows: int) -> Lease:
        """The free slot of the least-loaded device that has one, for a batch of `rows` (its bucket)."""
        candidates = self.free_devices()
        if not candidates:
            raise RuntimeError("SlotPool.take without a free slot; await wait_free() first")
        device = min(candidates, key=lambda d: (self.rows_in_flight[d], self.launched[d]))
        self.rows_in_flight[device] += rows
        self.batches_in_flight[device] += 1
        self.launched[device] += 1
        return Lease(device=device, engine=self.engines[device], slot=self._free[device].popleft(), rows=rows)

    def give_back(self, lease: Lease, *, reusable: bool) -> None:
        """The lease's batch is over. Its slot is free again only if `reusable`: the slot of a batch
        that never came back or broke its device stays out, as the device may still write to it."""
        self.rows_in_flight[lease.device] -= lease.rows
        self.batches_in_flight[lease.device] -= 1
        if reusable:
            self._free[lease.device].append(lease.slot)
            self._released.set()
