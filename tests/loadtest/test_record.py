"""A run's record from the merged raw figures: rates, latencies, counts, and the warnings that
say when the figures may be the generator's rather than the server's."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loadtest.payloads import Payloads, build_payloads
from loadtest.record import SCHEMA, build_record
from loadtest.spec import LoadSpec
from loadtest.stats import WorkerResult


@pytest.fixture(scope="module")
def payloads() -> Payloads:
    return build_payloads("raw", images_per_request=2, check_labels=False, limit=8)


def merged(*, n: int, lag_s: float, busy: float) -> WorkerResult:
    """n measured requests of 1..n ms, 2 of them timed out, each sent `lag_s` late."""
    return WorkerResult(
        latencies_s=np.arange(1, n + 1) / 1e3,
        lags_s=np.full(n, lag_s),
        offsets_s=(np.arange(n) + 0.5) / n,  # due evenly over the first second
        sent_in_window=n,
        ok_in_window=n - 4,
        ok=n - 2,
        warmup_requests=7,
        errors=Counter({"timeout": 2}),
        error_examples={"timeout": "ReadTimeout"},
        cpu_s=busy * 4.0,
        wall_s=4.0,
    )


def record(spec: LoadSpec, payloads: Payloads, result: WorkerResult) -> dict:
    return build_record(spec, payloads, result, command="python -m loadtest", started_at="t", processes=2)


def test_open_loop_record_figures(payloads: Payloads) -> None:
    spec = LoadSpec(url="http://127.0.0.1:9", rate=100.0, processes=2, warmup_s=0.5, duration_s=2.0)
    r = record(spec, payloads, merged(n=200, lag_s=0.0, busy=0.2))
    assert r["schema"] == SCHEMA and r["mode"] == "open" and r["arrivals"] == "poisson"
    assert r["offered_rate_rps"] == 100.0 and r["achieved_rate_rps"] == 100.0
    assert r["throughput_rps"] == 98.0 and r["images_per_s"] == 196.0  # ok in window / duration, × 2 images
    assert r["latency_ms"]["p50"] == 100.0 and r["latency_ms"]["p99"] == 198.0 and r["latency_ms"]["max"] == 200.0
    assert r["counts"] == {
        "measured": 200,
        "ok": 198,
        "errors": 2,
        "warmup_excluded": 7,
        "sent_in_window": 200,
        "ok_in_window": 196,
        "waited_for_connection": 0,
        "retried_stale_connection": 0,
    }
    assert r["errors"] == {"timeout": 2} and r["loadgen_cpu_busy"] == 0.2
    # Requests due over the first of the 2 s, slowest last: the slowest 1 % (199, 200 ms) in the tenth 0.1 s bin.
    tail = r["tail_over_time"]
    assert tail["requests"] == [20] * 10 + [0] * 10 and tail["slowest_1pct"][9] == 2 == sum(tail["slowest_1pct"])
    assert tail["slowest_1pct_in_busiest_tenth"] == 1.0
    assert r["warnings"] == ["200 measured requests: p99.9 is not meaningful below 1000"]
    assert "open loop, Poisson 100 req/s" in r["summary"] and "errors: timeout 2" in r["summary"]


def test_warnings_when_the_generator_may_be_the_limit(payloads: Payloads) -> None:
    spec = LoadSpec(url="http://127.0.0.1:9", rate=100.0, duration_s=2.0)
    warnings = record(spec, payloads, merged(n=2000, lag_s=0.010, busy=0.95))["warnings"]
    assert any("sent late (p99 10.0 ms" in w for w in warnings)
    assert any("95% busy" in w for w in warnings)
    assert not any("p99.9" in w for w in warnings)
    # Closed loop has no schedule to be late for: sends wait for answers by design.
    closed = LoadSpec(url="http://127.0.0.1:9", concurrency=4, duration_s=2.0)
    r = record(closed, payloads, merged(n=2000, lag_s=0.010, busy=0.2))
    assert r["warnings"] == [] and r["latency_from"] == "send time"
