"""app/ops/metric_buffers.py: buffered figures, once flushed, are exactly what prometheus_client's own
inc, set and observe would have made of the same updates."""

from __future__ import annotations

import asyncio
import gc
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.ops import metric_buffers
from app.ops.metric_buffers import BufferedHistogram, BufferedSum, BufferedValue

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0)
# On a bound, between bounds, below the first, past the last, zero and negative.
VALUES = [0.001, 0.0049, 0.005, 0.0051, 0.0, -1.0, 0.5, 1.0, 7.5, 0.01, 0.001, 123.0]


def pair() -> tuple[CollectorRegistry, CollectorRegistry]:
    return CollectorRegistry(), CollectorRegistry()


def text(registry: CollectorRegistry) -> str:
    # The _created lines hold each family's creation time, which differs between the two registries.
    return "\n".join(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


def test_a_flushed_histogram_equals_one_observed_directly() -> None:
    direct_registry, buffered_registry = pair()
    direct = Histogram("h", "h", ["model"], buckets=BUCKETS, registry=direct_registry).labels(model="m")
    buffered = BufferedHistogram(
        Histogram("h", "h", ["model"], buckets=BUCKETS, registry=buffered_registry).labels(model="m")
    )
    for value in VALUES:
        direct.observe(value)
        buffered.observe(value)
    assert "h_count" in text(direct_registry)
    assert text(buffered_registry) != text(direct_registry)  # nothing reached Prometheus before the flush
    buffered.flush()
    assert text(buffered_registry) == text(direct_registry)
    for value in VALUES[:3]:  # and again after a flush: the buffer starts from zero
        direct.observe(value)
        buffered.observe(value)
    buffered.flush()
    buffered.flush()  # a flush with nothing new adds nothing
    assert text(buffered_registry) == text(direct_registry)


def test_flushed_sums_and_values_equal_direct_counters_and_gauges() -> None:
    direct_registry, buffered_registry = pair()
    counter = Counter("c", "c", registry=direct_registry)
    gauge = Gauge("g", "g", registry=direct_registry)
    latest = Gauge("v", "v", registry=direct_registry)
    counter_b = BufferedSum(Counter("c", "c", registry=buffered_registry))
    gauge_b = BufferedSum(Gauge("g", "g", registry=buffered_registry))
    latest_b = BufferedValue(Gauge("v", "v", registry=buffered_registry))
    for amount in (1, 1, 3, 0.5):
        counter.inc(amount)
        counter_b.inc(amount)
    for up, down in ((2, 1), (1, 2), (5, 0)):
        gauge.inc(up)
        gauge.dec(down)
        gauge_b.inc(up)
        gauge_b.dec(down)
    for value in (7, 3, 9):
        latest.set(value)
        latest_b.set(value)
    metric_buffers.flush()  # the module's flush reaches every live buffer
    assert text(buffered_registry) == text(direct_registry)


def test_flush_every_flushes_on_its_interval_and_once_more_when_cancelled() -> None:
    registry = CollectorRegistry()
    counter = BufferedSum(Counter("c", "c", registry=registry))

    def value() -> float | None:
        return registry.get_sample_value("c_total")

    async def run() -> None:
        flusher = asyncio.create_task(metric_buffers.flush_every(0.01))
        counter.inc()
        for _ in range(1000):  # up to 10 s for a flush on the interval: nothing to await but the registry
            if value() == 1:
                break
            await asyncio.sleep(0.01)
        assert value() == 1
        counter.inc(2)
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
        assert value() == 3

    asyncio.run(run())


def test_a_dropped_buffer_leaves_the_flush_list() -> None:
    # The flush list is the module's, shared with every test before this one: buffers that earlier
    # tests left in reference cycles (a batcher and its tasks) leave it at the next collection too.
    # Collect those first, so that the count below moves by this buffer alone.
    gc.collect()
    buffer = BufferedSum(Counter("c", "c", registry=CollectorRegistry()))
    assert buffer in metric_buffers._buffers
    before = len(metric_buffers._buffers)
    dropped = weakref.ref(buffer)
    del buffer
    gc.collect()
    assert dropped() is None
    assert len(metric_buffers._buffers) == before - 1
