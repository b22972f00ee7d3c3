"""Choosing buckets and max delay under a p99 SLO: the queueing model, pure arithmetic.

Inputs, all measured on this machine (app/tuning/measure.py):
  replay[b] = (median, p99) seconds of one batch of bucket b through the engine's full path
  overhead  = (median, p99) seconds a request spends outside the engine (HTTP, decode, batcher)

A candidate is (the largest bucket B, max delay d). Its buckets are the measured ones ≤ B that
are faster than every larger one kept (a bucket no faster than a larger one only adds padding).
At an arrival rate λ (requests of one row per second):

  rows per batch   n = min(B, 1 + λ·d)     the first row opens the window, λ·d more arrive in it
  device busy      ρ = λ · r50(pad(n)) / n   must stay ≤ ρ_max, or λ counts as overload
  close wait       w = min(d, (B − 1)/λ)     the delay, or less where the largest bucket fills first
  p99(λ) ≈ w + r99(pad(n)) + r99(pad(n)) + o99
           the close wait, a free slot (the batch ahead still replaying), its own replay, and the
           per-request overhead

Only batches that the delay forms count. Past ρ_max the real batcher still copes for a while
(with no free slot, rows pile up and the next batch is larger), but then the device is never
idle and a Poisson burst has no room: the model does not count on that regime. So the delay is
what buys throughput (fuller batches, less device time per row) and what costs latency.

A server does not choose its load, so a candidate's capacity is the largest λ on a fine
geometric grid such that every grid rate up to it is sustainable with p99(λ') ≤ SLO. The chosen
candidate has the largest capacity; ties go to the smaller largest bucket, then the smaller max
delay. The model is worst-case (every batch waits for a whole batch ahead), ignores the host's
own throughput limit (HTTP parsing per request, one core's worth of Python), and ρ_max keeps
headroom for Poisson bursts; bench/tune_bench.py measures what it predicts.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

RHO_MAX = 0.8  # device utilisation the model allows: headroom for Poisson bursts
RATE_STEPS = 240  # geometric grid of arrival rates between RATE_LOW and the device's limit
RATE_LOW = 1.0  # req/s: the lightest load a server is assumed to see
DELAYS_MS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0, 75.0, 100.0)


@dataclass(frozen=True, slots=True)
class Timing:
    median_s: float
    p99_s: float

    def __post_init__(self) -> None:
        if not 0 <= self.median_s <= self.p99_s or not math.isfinite(self.p99_s):
            raise ValueError(f"a timing needs 0 ≤ median ≤ p99, finite; got {self.median_s} and {self.p99_s}")


@dataclass(frozen=True, slots=True)
class Choice:
    buckets: tuple[int, ...]
    max_delay_ms: float
    capacity_rps: float  # the largest sustainable rate with p99 ≤ SLO at every rate up to it
    p99_at_capacity_ms: float  # the model's p99 at that rate
    worst_p99_ms: float  # the model's highest p99 over every rate up to capacity
    bucket_at_capacity: int  # the bucket a typical batch pads to there


class InfeasibleSloError(ValueError):
    """No candidate meets the SLO even at the lightest load; says what the fastest one achieves."""

    def __init__(self, slo_ms: float, fastest_ms: float) -> None:
        super().__init__(
            f"no buckets and max delay meet p99 ≤ {slo_ms:g} ms: the fastest achievable p99 is {fastest_ms:.2f} ms "
            "(a lone request at max delay 0: a slot's wait, one replay and the service's overhead); raise the SLO"
        )
        self.slo_ms, self.fastest_ms = slo_ms, fastest_ms


def kept_buckets(replay: dict[int, Timing], largest: int) -> tuple[int, ...]:
    """Buckets ≤ `largest` (which is kept) whose median is below every larger kept bucket's."""
    kept = [largest]
    for bucket in sorted((b for b in replay if b < largest), reverse=True):
        if replay[bucket].median_s < replay[kept[-1]].median_s:
            kept.append(bucket)
    return tuple(sorted(kept))


def predicted_p99_s(
    replay: dict[int, Timing], buckets: tuple[int, ...], delay_s: float, overhead: Timing, rate: float
) -> tuple[float, int] | None:
    """(p99 seconds, bucket of a typical batch) of the model at `rate` req/s; None where it is overload."""
    largest = buckets[-1]
    rows = min(largest, 1 + rate * delay_s)  # expected rows of a batch (Poisson: 1 + λ·d)
    bucket = buckets[bisect.bisect_left(buckets, math.ceil(rows - 1e-9))]
    if rate * replay[bucket].median_s / rows > RHO_MAX:
        return None
    wait_s = min(delay_s, (largest - 1) / rate)
    return wait_s + 2 * replay[bucket].p99_s + overhead.p99_s, bucket


def capacity(
    replay: dict[int, Timing], buckets: tuple[int, ...], delay_s: float, overhead: Timing, slo_s: float
) -> Choice | None:
    """The candidate's capacity under the SLO (None: not even the lightest load meets it)."""
    largest = buckets[-1]
    limit = RHO_MAX * largest / replay[largest].median_s if replay[largest].median_s > 0 else 1e6
    best: Choice | None = None
    worst = 0.0
    for i in range(RATE_STEPS + 1):
        rate = RATE_LOW * (limit / RATE_LOW) ** (i / RATE_STEPS) if limit > RATE_LOW else limit
        predicted = predicted_p99_s(replay, buckets, delay_s, overhead, rate)
        if predicted is None or predicted[0] > slo_s:
            break
        worst = max(worst, predicted[0])
        best = Choice(buckets, delay_s * 1e3, rate, predicted[0] * 1e3, worst * 1e3, predicted[1])
    return best


def choose(
    replay: dict[int, Timing], overhead: Timing, slo_ms: float, *, delays_ms: tuple[float, ...] = DELAYS_MS
) -> Choice:
    """The buckets and max delay of the highest capacity under p99 ≤ `slo_ms`, or InfeasibleSloError."""
    if not replay:
        raise ValueError("no measured buckets to choose from")
    if slo_ms <= 0:
        raise ValueError(f"the SLO must be a positive number of milliseconds; got {slo_ms:g}")
    best: Choice | None = None
    for largest in sorted(replay):
        buckets = kept_buckets(replay, largest)
        for delay_ms in sorted(delays_ms):
            if delay_ms >= slo_ms:
                break
            found = capacity(replay, buckets, delay_ms / 1e3, overhead, slo_ms / 1e3)
            if found is not None and (best is None or found.capacity_rps > best.capacity_rps * (1 + 1e-9)):
                best = found
    if best is None:  # the lightest load, max delay 0: a lone row pads to a candidate's smallest bucket
        fastest = min(replay[kept_buckets(replay, largest)[0]].p99_s for largest in replay)
        raise InfeasibleSloError(slo_ms, (2 * fastest + overhead.p99_s) * 1e3)
    return best
