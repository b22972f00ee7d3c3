"""Per-bucket replay times of one model's engine, built exactly as the service builds it.

A batch's time is the wall time of `await engine.run(slot, bucket, dtype)` on an asyncio loop:
the engine's full path (host-to-device copy, the graph's replay, softmax, device-to-host copy)
and the hand-back, which is what a batch holds its slot for. Batches run one at a time, as the
device runs them (one stream), on random pixels; the first `warmup` runs of each bucket are left
out (allocator, cudnn and cache warm-up), then the median and p99 of `runs` are kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np

from app.engines.base import Engine, InputDtype
from app.engines.factory import EngineOptions, build_engine
from app.repository import LoadedModel
from app.tuning.choose import Timing

# Powers of two and the steps halfway between them (×1.5): a bucket near every batch size that
# a max delay can produce, without capturing (and compiling) every size.
CANDIDATE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def candidate_buckets(max_bucket: int) -> tuple[int, ...]:
    if max_bucket < 1:
        raise ValueError(f"the largest candidate bucket must be ≥ 1; got {max_bucket}")
    return tuple(b for b in CANDIDATE_BUCKETS if b <= max_bucket) or (1,)


def timing_of(samples_s: list[float]) -> Timing:
    """Median and nearest-rank p99 of seconds (at least one sample)."""
    values = np.sort(np.asarray(samples_s, dtype=np.float64))
    p99 = float(np.percentile(values, 99, method="inverted_cdf"))
    return Timing(median_s=float(np.median(values)), p99_s=max(p99, float(np.median(values))))


def build_candidate_engine(
    model: LoadedModel,
    options: EngineOptions,
    buckets: tuple[int, ...],
    *,
    in_flight: int,
    event_wait: str,
    host_io: str,
) -> Engine:
    """The engine the service would build for `model` (its settings' in_flight, event_wait and
    host_io, as app/service.py passes them), with `buckets` in place of its own."""
    options = dataclasses.replace(options, buckets=buckets)
    return build_engine(model, options, in_flight=in_flight, event_wait=event_wait, host_io=host_io)


async def replay_table(engine: Engine, *, dtype: InputDtype, runs: int, warmup: int = 5) -> dict[int, Timing]:
    """bucket → Timing of `runs` batches after `warmup`, every bucket of `engine`."""
    if runs < 1:
        raise ValueError(f"runs must be ≥ 1; got {runs}")
    slot = engine.slots[0]
    staging = slot.inputs[dtype]  # (max_bucket, C, H, W)
    rng = np.random.default_rng(0)
    if dtype == "uint8":
        staging[...] = rng.integers(0, 256, staging.shape, dtype=np.uint8)
    else:
        staging[...] = rng.random(staging.shape, dtype=np.float32)
    table = {}
    for bucket in engine.buckets:
        samples = []
        for i in range(warmup + runs):
            started = time.perf_counter()
            await engine.run(slot, bucket, dtype)
            if i >= warmup:
                samples.append(time.perf_counter() - started)
        table[bucket] = timing_of(samples)
    return table


def measure_replays(engine: Engine, *, dtype: InputDtype, runs: int, warmup: int = 5) -> dict[int, Timing]:
    """replay_table on a fresh event loop (uvloop where present, as the server runs)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(replay_table(engine, dtype=dtype, runs=runs, warmup=warmup))
    return uvloop.run(replay_table(engine, dtype=dtype, runs=runs, warmup=warmup))
