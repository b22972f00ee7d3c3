"""How long the event loop was kept from running, and what the garbage collector took: two metrics.

Everything a worker serves runs on one event loop, so anything that holds it (a long callback,
a decode left on the loop, a full garbage collection) delays every request in that process at
once; the engine process's one loop batches for every worker, so its lag delays them all. A
sampler task asks to wake every SAMPLE_INTERVAL_S and records how late it woke: the loop's lag,
the p99 of which should stay at a few ms. The gc callback times each collection by
generation, so a lag spike can be told apart from a collection.

The callback itself never touches a metric: a collection can start inside prometheus_client
while it holds its lock (with several workers, one lock for every metric of the process), and
an observe from the callback would then wait for that lock forever — workers hung at start-up
in 4 of 5 tries before this was so. It only appends to a deque; the sampler, in plain code on
the loop, moves what it finds into the histogram.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from typing import Any

from app.ops import metrics

SAMPLE_INTERVAL_S = 0.05  # 20 samples a second: catches a 10 ms stall, costs nothing measurable
PENDING_LIMIT = 10_000  # collections not yet published; a stalled sampler drops the oldest


class GcPauses:
    """A gc callback that notes each collection's (generation, seconds); `publish` observes them."""

    def __init__(self, process: str = "worker") -> None:
        self._started = 0.0
        self._pending: deque[tuple[int, float]] = deque(maxlen=PENDING_LIMIT)  # append: no lock, no metric
        self._children = [metrics.GC_PAUSE.labels(generation=str(g), process=process) for g in range(3)]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._pending.append((info["generation"], time.perf_counter() - self._started))

    def publish(self) -> None:
        """Into cgserve_gc_pause_seconds{generation, process}: every collection noted since the last call."""
        while self._pending:
            generation, seconds = self._pending.popleft()
            self._children[generation].observe(seconds)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


async def sample_loop_lag(gc_pauses: GcPauses | None = None, process: str = "worker") -> None:
    """Run until cancelled: each wake-up's lateness into cgserve_event_loop_lag_seconds{process}, and
    the collections `gc_pauses` noted meanwhile into cgserve_gc_pause_seconds."""
    observe = metrics.EVENT_LOOP_LAG.labels(process=process).observe
    while True:
        asked = time.perf_counter() + SAMPLE_INTERVAL_S
        await asyncio.sleep(SAMPLE_INTERVAL_S)
        observe(max(0.0, time.perf_counter() - asked))
        if gc_pauses is not None:
            gc_pauses.publish()
