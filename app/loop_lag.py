"""How long the event loop was kept from running, and what the garbage collector took: two metrics.

Everything a worker serves runs on one event loop, so anything that holds it (a long callback,
a decode left on the loop, a full garbage collection) delays every request in that process at
once. A sampler task asks to wake every SAMPLE_INTERVAL_S and records how late it woke: the
loop's lag, the p99 of which should stay at a few ms. The gc callback times each collection by
generation, so a lag spike can be told apart from a collection.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from app import metrics

SAMPLE_INTERVAL_S = 0.05  # 20 samples a second: catches a 10 ms stall, costs nothing measurable


async def sample_loop_lag() -> None:
    """Run until cancelled: each wake-up's lateness into cgserve_event_loop_lag_seconds."""
    observe = metrics.EVENT_LOOP_LAG.observe
    while True:
        asked = time.perf_counter() + SAMPLE_INTERVAL_S
        await asyncio.sleep(SAMPLE_INTERVAL_S)
        observe(max(0.0, time.perf_counter() - asked))


class GcPauses:
    """A gc callback: each collection's duration into cgserve_gc_pause_seconds{generation}."""

    def __init__(self) -> None:
        self._started = 0.0
        self._children = [metrics.GC_PAUSE.labels(generation=str(g)) for g in range(3)]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._children[info["generation"]].observe(time.perf_counter() - self._started)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
