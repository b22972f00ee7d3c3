"""Percentiles, the Poisson schedule, measurement windows and the merge of processes' results."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loadtest.stats import (
    WorkerResult,
    latency_summary_ms,
    merge_results,
    percentile,
    poisson_schedule,
    split_evenly,
    tail_over_time,
    window_result,
)


def test_percentile_is_nearest_rank() -> None:
    values = np.arange(1, 101, dtype=float)  # 1..100
    shuffled = np.random.default_rng(0).permutation(values)
    assert percentile(shuffled, 50) == 50
    assert percentile(shuffled, 90) == 90
    assert percentile(shuffled, 99) == 99
    assert percentile(shuffled, 99.9) == 100  # rank ceil(99.9) = 100: never below a real sample
    assert percentile(shuffled, 100) == 100
    assert percentile(shuffled, 0) == 1


def test_percentile_edge_cases() -> None:
    assert percentile(np.array([]), 99) is None
    assert percentile(np.array([7.0]), 50) == 7.0
    assert percentile(np.array([1.0, 1000.0]), 50) == 1.0  # never interpolated: no 500.5
    assert percentile(np.array([1.0, 1000.0]), 51) == 1000.0
    with pytest.raises(ValueError, match="range"):
        percentile(np.array([1.0]), 101)


def test_latency_summary_in_ms() -> None:
    summary = latency_summary_ms(np.array([0.001, 0.002, 0.003, 0.010]))
    assert summary["p50"] == 2.0 and summary["p99"] == 10.0 and summary["max"] == 10.0 and summary["min"] == 1.0
    assert summary["mean"] == 4.0
    assert set(summary) == {"p50", "p90", "p99", "p99_9", "max", "mean", "min"}
    empty = latency_summary_ms(np.array([]))
    assert set(empty) == set(summary) and all(v is None for v in empty.values())


def test_poisson_schedule_statistics() -> None:
    rate, horizon = 1000.0, 20.0
    times = poisson_schedule(rate, horizon, np.random.default_rng(1))
    n = len(times)
    assert abs(n - rate * horizon) < 5 * np.sqrt(rate * horizon)  # count ~ Poisson(20000)
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < horizon
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1
    # Counts in 1-second bins are Poisson: variance ≈ mean.
    counts = np.bincount(times.astype(int), minlength=int(horizon))
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.6)


def test_poisson_schedule_is_seeded_and_covers_short_horizons() -> None:
    a = poisson_schedule(50.0, 3.0, np.random.default_rng([0, 1]))
    b = poisson_schedule(50.0, 3.0, np.random.default_rng([0, 1]))
    c = poisson_schedule(50.0, 3.0, np.random.default_rng([0, 2]))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    tiny = poisson_schedule(0.5, 100.0, np.random.default_rng(3))  # few arrivals, long horizon
    assert tiny[-1] < 100.0 and len(tiny) > 20
    with pytest.raises(ValueError):
        poisson_schedule(0.0, 1.0, np.random.default_rng(0))


def test_window_result_counts_by_schedule_send_and_completion() -> None:
    w0, w1 = 10.0, 20.0
    rows = [
        (5.0, 5.0, 5.1, None),  # warm-up, ok
        (9.0, 9.0, 9.5, "http_503:overloaded"),  # warm-up error: kept apart
        (9.9, 9.9, 10.5, None),  # warm-up, but its answer lands in the window: throughput
        (11.0, 11.0, 11.004, None),  # plain
        (12.0, 12.5, 12.6, None),  # sent 0.5 s late: latency from the schedule, 0.6 s
        (13.0, 12.9995, 13.002, None),  # timer fired early: latency from the real send
        (14.0, 14.0, 14.1, "wrong_label"),
        (19.9, 19.9, 20.3, None),  # answered after the window: measured, not throughput
    ]
    res = window_result(rows, w0, w1)
    assert res.measured == 5 and res.ok == 4
    assert res.errors == Counter({"wrong_label": 1})
    assert res.warmup_errors == Counter({"http_503:overloaded": 1}) and res.warmup_requests == 3
    assert res.sent_in_window == 5
    assert res.ok_in_window == 4  # 10.5, 11.004, 12.6, 13.002
    assert res.latencies_s.tolist() == pytest.approx([0.004, 0.6, 0.0025, 0.1, 0.4])
    assert res.lags_s.tolist() == pytest.approx([0.0, 0.5, -0.0005, 0.0, 0.0])
    assert res.offsets_s.tolist() == pytest.approx([1.0, 2.0, 3.0, 4.0, 9.9])  # due times from the window's start
    assert res.window_start_s == w0


def test_merge_results_concatenates_raw_samples() -> None:
    a = WorkerResult(
        latencies_s=np.array([0.001, 0.002]),
        lags_s=np.array([0.0, 0.0]),
        ok=2,
        sent_in_window=2,
        ok_in_window=2,
        server={"model": "m", "engine": "cuda-graph"},
        cpu_s=1.0,
        wall_s=2.0,
    )
    b = WorkerResult(
        latencies_s=np.array([0.100]),
        lags_s=np.array([0.001]),
        sent_in_window=1,
        warmup_requests=3,
        errors=Counter({"timeout": 1}),
        error_examples={"timeout": "ReadTimeout"},
        connection_waits=4,
        cpu_s=0.5,
        wall_s=2.0,
    )
    merged = merge_results([a, b])
    assert sorted(merged.latencies_s.tolist()) == [0.001, 0.002, 0.100]
    assert merged.measured == 3 and merged.ok == 2 and merged.sent_in_window == 3
    assert merged.errors == Counter({"timeout": 1}) and merged.error_examples == {"timeout": "ReadTimeout"}
    assert merged.warmup_requests == 3 and merged.connection_waits == 4
    assert merged.server == {"model": "m", "engine": "cuda-graph"}
    assert merged.cpu_s == 1.5 and merged.wall_s == 4.0
    # A percentile of the merge is not an average of the processes' percentiles.
    assert percentile(merged.latencies_s, 50) == 0.002
    assert merge_results([]).measured == 0
    starts = merge_results([WorkerResult(window_start_s=5.002), WorkerResult(window_start_s=5.0), WorkerResult()])
    assert starts.window_start_s == 5.0


def test_split_evenly() -> None:
    assert split_evenly(10, 3) == [4, 3, 3]
    assert split_evenly(2, 4) == [1, 1, 0, 0]
    assert sum(split_evenly(64, 7)) == 64
    with pytest.raises(ValueError):
        split_evenly(4, 0)


def test_tail_over_time_tells_a_stall_from_a_spread_tail() -> None:
    # 2 s in 0.1 s bins, 100 requests a bin at 5 ms; then a 300 ms stall in bin 7 (its 100 requests at 300 ms).
    offsets = np.repeat(np.arange(20) * 0.1, 100) + np.tile(np.linspace(0, 0.099, 100), 20)
    latencies = np.full(2000, 0.005)
    stalled = latencies.copy()
    stalled[700:800] = 0.300
    stall = tail_over_time(offsets, stalled, 2.0, 0.1)
    assert stall["requests"] == [100] * 20
    assert stall["slowest_1pct"][7] == sum(stall["slowest_1pct"]) == 20  # the 1 %: 20 of 2000, all in the stall
    assert stall["slowest_1pct_in_busiest_tenth"] == 1.0
    assert stall["p99_ms"][7] == 300.0 and stall["p99_ms"][0] == 5.0
    # 20 slow requests, one in each bin, each a little slower than the last: spread over the run.
    spread = latencies.copy()
    spread[50::100] = 0.300 + np.arange(20) * 1e-3
    even = tail_over_time(offsets, spread, 2.0, 0.1)
    assert even["slowest_1pct"] == [1] * 20
    assert even["slowest_1pct_in_busiest_tenth"] == 0.1
    # Ties: still the 20 slowest, not every request at the cut.
    ties = tail_over_time(offsets, latencies, 2.0, 0.1)
    assert sum(ties["slowest_1pct"]) == 20


def test_tail_over_time_of_no_requests_has_empty_bins() -> None:
    out = tail_over_time(np.empty(0), np.empty(0), 0.25, 0.1)
    assert out["requests"] == [0, 0, 0] and out["slowest_1pct_in_busiest_tenth"] is None
