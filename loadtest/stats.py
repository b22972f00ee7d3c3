"""The pure arithmetic of a load run: percentiles, one process's result, and their merge.

Nothing here touches the network, so the figures a run reports are unit-tested on their own.
Latencies travel as raw float64 seconds (one value per request) and are merged before any
percentile is taken: percentiles of several processes cannot be averaged.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The figures every record quotes; p99.9 needs ≥ 1000 samples to mean anything (see `counts`).
QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99_9": 99.9}


def percentile(values: np.ndarray, q: float) -> float | None:
    """Nearest-rank percentile: the smallest sample with at least q% of the samples ≤ it.

    numpy's "inverted_cdf": conservative, never interpolated below a real sample, as
    HdrHistogram and wrk2 quote tails. `values` float (N,), any order; None for an empty array.
    """
    if len(values) == 0:
        return None
    return float(np.percentile(values, q, method="inverted_cdf"))


def latency_summary_ms(latencies_s: np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99/p99.9/max/mean/min in milliseconds of raw latencies in seconds (N,)."""
    ms = np.asarray(latencies_s, dtype=np.float64) * 1e3
    if len(ms) == 0:
        return dict.fromkeys([*QUANTILES, "max", "mean", "min"])
    quantiles = np.percentile(ms, list(QUANTILES.values()), method="inverted_cdf")  # one sort for all
    out = dict(zip(QUANTILES, quantiles.tolist(), strict=True))
    out |= {"max": float(ms.max()), "mean": float(ms.mean()), "min": float(ms.min())}
    return {k: round(v, 4) for k, v in out.items()}


def poisson_schedule(rate: float, horizon_s: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (s, float64 (N,), increasing, all < horizon_s) of a Poisson process of `rate`/s.

    Inter-arrival gaps are exponential with mean 1/rate, so arrivals are independent of the
    server's answers (open loop). N is random with mean rate × horizon_s.
    """
    if rate <= 0 or horizon_s <= 0:
        raise ValueError(f"rate and horizon must be > 0, got rate={rate}, horizon_s={horizon_s}")
    # Draw a few σ more gaps than expected so one draw almost always covers the horizon.
    expected = rate * horizon_s
    times = np.cumsum(rng.exponential(1.0 / rate, int(expected + 6 * math.sqrt(expected) + 16)))
    while times[-1] < horizon_s:  # rare: extend until the horizon is covered
        more = np.cumsum(rng.exponential(1.0 / rate, len(times))) + times[-1]
        times = np.concatenate([times, more])
    return times[times < horizon_s]


@dataclass
class WorkerResult:
    """What one load-generator process measured. Only requests inside the measurement window
    (after the warm-up) enter `latencies_s`, `lags_s` and `errors`.

    latencies_s: float64 (M,) per measured request, from its scheduled send to its outcome
    lags_s:      float64 (M,) actual send − scheduled send (the generator's own delay)
    offsets_s:   float64 (M,) scheduled send − the window's start: when in the run each one was due
    """

    latencies_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    lags_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    offsets_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    window_start_s: float | None = None  # the window's start, time.perf_counter (CLOCK_MONOTONIC: the server's clock)
    sent_in_window: int = 0  # requests whose actual send fell in the window (achieved rate)
    ok_in_window: int = 0  # correct answers that arrived in the window (throughput)
    ok: int = 0  # measured requests answered correctly
    warmup_requests: int = 0  # requests scheduled during the warm-up, left out of the figures
    errors: Counter[str] = field(default_factory=Counter)  # measured requests, by kind
    warmup_errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, str] = field(default_factory=dict)  # first message per kind
    server: dict[str, str] = field(default_factory=dict)  # "model"/"engine" of the first answer
    connection_waits: int = 0  # requests that waited for a free connection (the pool limit)
    stale_retries: int = 0  # requests sent again: the server had closed their idle connection
    # Measured latencies (s) by outcome: "ok" or the error kind, e.g. how fast 503s come back.
    latencies_by_outcome: dict[str, list[float]] = field(default_factory=dict)
    cpu_s: float = 0.0  # the generator's own CPU time over the run (summed over processes)
    wall_s: float = 0.0  # the run's wall time (summed over processes): cpu_s / wall_s = busy share
    requests: int = 0  # every request of the run, warm-up included: cpu_s / requests = CPU per request

    @property
    def measured(self) -> int:
        return len(self.latencies_s)


def window_result(rows: list[tuple[float, float, float, str | None]], w0: float, w1: float) -> WorkerResult:
    """One process's figures from its raw rows (scheduled, sent, done, error kind or None).

    A request belongs to the window [w0, w1) by its scheduled time (so a late send still counts
    against the server's load), counts towards the achieved rate by its actual send, and towards
    throughput by its completion. Latency runs from min(scheduled, sent): timers may fire a
    little early, never to the server's credit.
    """
    res = WorkerResult(requests=len(rows), window_start_s=w0)
    latencies, lags, offsets = [], [], []
    for t_sched, t_send, t_done, kind in rows:
        if w0 <= t_send < w1:
            res.sent_in_window += 1
        if kind is None and w0 <= t_done < w1:
            res.ok_in_window += 1
        if t_sched < w0:
            res.warmup_requests += 1
            if kind is not None:
                res.warmup_errors[kind] += 1
            continue
        if t_sched >= w1:
            continue  # closed loop: sent as the window closed
        latency = t_done - min(t_sched, t_send)
        latencies.append(latency)
        res.latencies_by_outcome.setdefault(kind or "ok", []).append(latency)
        lags.append(t_send - t_sched)
        offsets.append(t_sched - w0)
        if kind is None:
            res.ok += 1
        else:
            res.errors[kind] += 1
    res.latencies_s = np.asarray(latencies, dtype=np.float64)
    res.lags_s = np.asarray(lags, dtype=np.float64)
    res.offsets_s = np.asarray(offsets, dtype=np.float64)
    return res


def merge_results(results: list[WorkerResult]) -> WorkerResult:
    """One result from several processes that measured the same window: raw samples are
    concatenated, counts added, the first example of each error kind kept."""
    merged = WorkerResult(
        latencies_s=np.concatenate([r.latencies_s for r in results]) if results else np.empty(0),
        lags_s=np.concatenate([r.lags_s for r in results]) if results else np.empty(0),
        offsets_s=np.concatenate([r.offsets_s for r in results]) if results else np.empty(0),
        # The processes' windows start together (one wall-clock start, each translated to its clock): the first.
        window_start_s=min((r.window_start_s for r in results if r.window_start_s is not None), default=None),
    )
    for r in results:
        merged.sent_in_window += r.sent_in_window
        merged.ok_in_window += r.ok_in_window
        merged.ok += r.ok
        merged.warmup_requests += r.warmup_requests
        merged.connection_waits += r.connection_waits
        merged.stale_retries += r.stale_retries
        merged.cpu_s += r.cpu_s
        merged.requests += r.requests
        merged.wall_s += r.wall_s
        merged.errors.update(r.errors)
        merged.warmup_errors.update(r.warmup_errors)
        for kind, message in r.error_examples.items():
            merged.error_examples.setdefault(kind, message)
        for outcome, values in r.latencies_by_outcome.items():
            merged.latencies_by_outcome.setdefault(outcome, []).extend(values)
        for key, value in r.server.items():
            merged.server.setdefault(key, value)
    return merged


def tail_over_time(offsets_s: np.ndarray, latencies_s: np.ndarray, duration_s: float, bin_s: float) -> dict[str, Any]:
    """Where in the run its slowest 1 % were due: a tail spread over the whole run is queueing at the
    load; one packed into a few bins is a stall (a pause, a burst the server fell behind on).

    offsets_s, latencies_s: float64 (M,), each measured request's due time from the window's start
    and its latency. Per bin of `bin_s` seconds: its requests, their p99 (ms) and how many of the
    run's slowest 1 % (its ceil(M / 100) slowest, ties taken in due order) it holds; and the share of
    those that the busiest tenth of the bins holds (a tenth rounded, at least one bin: about 0.1 for an
    even spread, near 1 for a stall).
    """
    n_bins = max(1, math.ceil(duration_s / bin_s))
    if len(latencies_s) == 0:
        return {"bin_s": bin_s, "requests": [0] * n_bins, "p99_ms": [None] * n_bins, "slowest_1pct": [0] * n_bins,
                "slowest_1pct_in_busiest_tenth": None}  # fmt: skip
    bins = np.minimum((np.asarray(offsets_s) / bin_s).astype(np.int64), n_bins - 1)
    slowest = np.argsort(-np.asarray(latencies_s), kind="stable")[: math.ceil(len(latencies_s) / 100)]
    slow_per_bin = np.bincount(bins[slowest], minlength=n_bins)
    busiest = np.sort(slow_per_bin)[::-1][: max(1, round(n_bins / 10))]
    p99s = [percentile(latencies_s[bins == b], 99) for b in range(n_bins)]
    return {
        "bin_s": bin_s,
        "requests": np.bincount(bins, minlength=n_bins).tolist(),
        "p99_ms": [None if v is None else round(v * 1e3, 2) for v in p99s],
        "slowest_1pct": slow_per_bin.tolist(),
        "slowest_1pct_in_busiest_tenth": round(float(busiest.sum() / len(slowest)), 3),
    }


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` split into `parts` integers that differ by at most one (largest first)."""
    if parts <= 0:
        raise ValueError(f"parts must be > 0, got {parts}")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
