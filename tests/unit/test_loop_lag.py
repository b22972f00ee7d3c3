"""The event-loop lag sampler, the gc pause metric and the start-up heap freeze."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

from app.ops import metrics
from app.ops.heap import freeze_startup_heap
from app.ops.loop_lag import SAMPLE_INTERVAL_S, GcPauses, sample_loop_lag

WORKER_LAG = metrics.EVENT_LOOP_LAG.labels(process="worker")  # what sample_loop_lag() observes by default


def _count(histogram_child: object) -> float:
    """Observations so far of one histogram child (its +Inf bucket)."""
    samples = [s for metric in histogram_child.collect() for s in metric.samples]  # type: ignore[attr-defined]
    return next(s.value for s in samples if s.name.endswith("_count"))


def _sum(histogram_child: object) -> float:
    samples = [s for metric in histogram_child.collect() for s in metric.samples]  # type: ignore[attr-defined]
    return next(s.value for s in samples if s.name.endswith("_sum"))


def test_a_blocked_loop_shows_as_lag() -> None:
    async def block_the_loop_once() -> None:
        sampler = asyncio.create_task(sample_loop_lag())
        await asyncio.sleep(SAMPLE_INTERVAL_S / 2)
        time.sleep(0.2)  # noqa: ASYNC251 - on purpose: holds the loop, as a full gc or an on-loop decode would
        await asyncio.sleep(2 * SAMPLE_INTERVAL_S)
        sampler.cancel()

    count, total = _count(WORKER_LAG), _sum(WORKER_LAG)
    asyncio.run(block_the_loop_once())
    assert _count(WORKER_LAG) - count >= 2
    assert _sum(WORKER_LAG) - total >= 0.15  # the 0.2 s hold, less the half interval already asleep


def test_each_collection_is_timed_by_generation_and_published_outside_the_callback() -> None:
    pauses = GcPauses()
    full = metrics.GC_PAUSE.labels(generation="2", process="worker")
    before = _count(full)
    pauses.install()
    pauses.install()  # once only
    try:
        gc.collect()
        assert _count(full) == before  # the callback touches no metric (its lock may be held)
        pauses.publish()
    finally:
        pauses.remove()
    assert _count(full) - before == 1
    gc.collect()
    pauses.publish()
    assert _count(full) - before == 1  # removed: no longer noted


def test_a_collection_inside_a_metric_update_cannot_deadlock_it() -> None:
    """A collection that starts while prometheus_client holds a value's lock (an observe in
    progress) must not wait for that lock: the hang of multi-worker start-ups, where one lock
    guards every metric. Here the histogram's own lock is held, as its observe would hold it."""
    pauses = GcPauses()
    value_lock = metrics.GC_PAUSE.labels(generation="2", process="worker")._sum._lock  # type: ignore[attr-defined]

    def collect_while_the_metric_is_locked() -> None:
        with value_lock:
            gc.collect()

    pauses.install()
    try:
        worker = threading.Thread(target=collect_while_the_metric_is_locked, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the gc callback waited for a metric's lock"
    finally:
        pauses.remove()
    pauses.publish()


def test_the_frozen_start_up_heap_is_skipped_by_full_collections() -> None:
    try:
        frozen = freeze_startup_heap()
        # torch, numpy, the app: everything imported. Not equal to the count now: a frozen object another thread
        # lets go of meanwhile (pytest-xdist's I/O thread) leaves the permanent generation.
        assert frozen > 10_000 and frozen - 1_000 < gc.get_freeze_count() <= frozen
        survivors = len(gc.get_objects(generation=2))
        assert survivors < frozen // 10  # what a full collection still walks
    finally:
        gc.unfreeze()
