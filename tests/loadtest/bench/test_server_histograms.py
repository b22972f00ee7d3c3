"""The benchmarks' view of the server's own histograms: a split family is read whole and per process."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.harness import server_histograms


def exposition(observations: int) -> str:
    """/metrics of a server whose workers' loops lagged 0.5 ms and whose engine process's lagged 5 ms."""
    registry = CollectorRegistry()
    lag = Histogram("cgserve_event_loop_lag_seconds", "", ["process"], registry=registry, buckets=(0.001, 0.01))
    for _ in range(observations):
        lag.labels(process="worker").observe(0.0005)
        lag.labels(process="engines").observe(0.005)
    return generate_latest(registry).decode()


def test_the_loop_lag_is_read_whole_and_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    class Answer:
        status_code = 200
        headers: ClassVar = {"content-type": "text/plain; version=0.0.4; charset=utf-8"}  # Prometheus text
        text = ""

    def scrape(observations: int) -> Any:
        Answer.text = exposition(observations)
        monkeypatch.setattr(server_histograms.httpx, "get", lambda *args, **kwargs: Answer)
        return server_histograms.scrape("http://127.0.0.1:1")

    view = server_histograms.step_view(scrape(2), scrape(10))
    assert view["loop_lag_ms"]["count"] == 16  # every process's samples together
    assert view["loop_lag_ms_worker"] == {"count": 8, "mean": 0.5, "p50": 1.0, "p99": 1.0}
    assert view["loop_lag_ms_engines"] == {"count": 8, "mean": 5.0, "p50": 10.0, "p99": 10.0}


def test_a_metrics_page_that_is_not_prometheus_text_is_no_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw no-op answers every GET with its readiness JSON: no histograms there, and no error."""

    class Answer:
        status_code = 200
        headers: ClassVar = {"content-type": "application/json"}
        text = '{"status":"ready"}'

    monkeypatch.setattr(server_histograms.httpx, "get", lambda *args, **kwargs: Answer)
    assert server_histograms.scrape("http://127.0.0.1:1") is None
