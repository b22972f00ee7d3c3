"""Hot-path metrics kept as plain numbers on the event loop, handed to Prometheus every FLUSH_S.

A prometheus_client inc or observe is three Python calls and a lock (with several workers, one
lock for every metric of the process): about 5,000 instructions. A batch made eleven of them and
a request three more, 63,000 instructions a batch at one row a batch, an eighth of that request
(bench/results/2026-12-01-cpu-instructions-per-request.md). Here an inc is a float add and an
observe a bisect and an int add; flush() moves the totals into the Prometheus children:

- every FLUSH_S, from the task Service runs (`flush_every`), in each process that serves;
- at once before a process renders /metrics (app/ops/metrics.py's exposition_off_loop), so a scrape of a single
  process sees every request it answered. With several workers, what another worker did in its
  last FLUSH_S shows at the next scrape: for Prometheus, scraping every few seconds, nothing.

Only code on the event loop touches a buffer (the batcher, the route handlers, gRPC's aio
handlers, the flush): no lock, and no update is lost between a read and a reset.

Why a histogram's flush writes prometheus_client's private `_buckets[i]` and `_sum` (the one place
this codebase reaches past its public API): the public Histogram has no bulk observe, and replaying
each buffered value through observe() costs the ~5,000 instructions a call that the buffer exists
to save; a custom collector (HistogramMetricFamily, public) is not written to the multiprocess files
through which N workers' figures add up. `_buckets` and `_sum` are the histogram's own values
(mmap-backed under multiprocess); tests/unit/test_metric_buffers.py holds the flushed exposition
equal to direct observes, so a prometheus_client that changes them fails there, not in production.
"""

from __future__ import annotations

import asyncio
import bisect
import weakref
from typing import Any

import numpy as np

FLUSH_S = 0.1

# Every live buffer; a batcher's go with it (it flushes on stop). Weak, so that tests that build
# thousands of batchers do not leave thousands of buffers for each flush to walk.
_buffers: weakref.WeakSet[Any] = weakref.WeakSet()


class BufferedSum:
    """A counter's (or a gauge's) increments and decrements, summed until flush()."""

    __slots__ = ("__weakref__", "child", "pending")

    def __init__(self, child: Any) -> None:
        self.child, self.pending = child, 0.0
        _buffers.add(self)

    def inc(self, amount: float = 1.0) -> None:
        self.pending += amount

    def dec(self, amount: float = 1.0) -> None:
        self.pending -= amount

    def flush(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, 0.0
            self.child.inc(pending)


class BufferedValue:
    """A gauge's latest set(), written at flush()."""

    __slots__ = ("__weakref__", "child", "value")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.value: float | None = None
        _buffers.add(self)

    def set(self, value: float) -> None:
        self.value = value

    def flush(self) -> None:
        if self.value is not None:
            value, self.value = self.value, None
            self.child.set(value)


class BufferedHistogram:
    """A histogram child's observations as counts per bucket and a sum, added in at flush().

    Reads the child's bucket bounds and adds to its bucket and sum values: prometheus_client's
    own fields (stable since 0.4; there is no public bulk observe). tests/unit/test_metric_buffers.py
    holds the result to what the public observe() gives for the same values."""

    __slots__ = ("__weakref__", "bounds", "child", "counts", "observed", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)  # ascending, the last +Inf
        self.counts = [0] * len(self.bounds)
        self.observed = 0
        self.total = 0.0
        _buffers.add(self)

    def observe(self, value: float) -> None:
        # prometheus_client counts a value in the first bucket whose bound is ≥ it: bisect_left.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.observed += 1
        self.total += value

    def observe_many(self, values: np.ndarray) -> None:
        """observe() of each value, at once: a bulk's latencies (app/front_door/feeder.py)."""
        found = np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.bounds))
        for i in np.flatnonzero(found).tolist():
            self.counts[i] += int(found[i])
        self.observed += len(values)
        self.total += float(values.sum())

    def flush(self) -> None:
        if not self.observed:
            return
        counts, total = self.counts, self.total
        self.counts, self.total, self.observed = [0] * len(self.bounds), 0.0, 0
        for i, count in enumerate(counts):
            if count:
                self.child._buckets[i].inc(count)
        self.child._sum.inc(total)


def flush() -> None:
    """Every buffer's figures into Prometheus, now."""
    for buffer in list(_buffers):
        buffer.flush()


async def flush_every(interval_s: float = FLUSH_S) -> None:
    """Run until cancelled (and flush once more then)."""
    try:
        while True:
            await asyncio.sleep(interval_s)
            flush()
    finally:
        flush()
