"""GET /metrics renders off the event loop (issue 24.3): while a render is in progress, /healthz is
answered, and scrapes that arrive meanwhile share that render."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric

from app.config import Settings
from app.main import create_app

WAIT_S = 30.0  # a bound for a failure to show, never reached when the render is off the loop


class BlockingCollector:
    """A collector whose collect() blocks, once armed, until released: a slow render, on demand."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.renders = 0

    def collect(self) -> Iterable[Metric]:
        if self.armed:
            self.renders += 1
            self.entered.set()
            self.release.wait(WAIT_S)
        yield GaugeMetricFamily("cgserve_test_blocking", "A collector the test holds.", value=1)


@pytest.fixture
def collector() -> Iterator[BlockingCollector]:
    blocking = BlockingCollector()
    REGISTRY.register(blocking)
    try:
        yield blocking
    finally:
        blocking.release.set()
        REGISTRY.unregister(blocking)


def test_healthz_is_answered_while_metrics_render(collector: BlockingCollector) -> None:
    with TestClient(create_app(Settings())) as client:
        collector.armed = True
        scrapes: list[httpx.Response] = []
        scrapers = [threading.Thread(target=lambda: scrapes.append(client.get("/metrics"))) for _ in range(2)]
        scrapers[0].start()
        assert collector.entered.wait(WAIT_S)  # the first scrape's render is in progress, and held
        scrapers[1].start()
        health: list[httpx.Response] = []
        prober = threading.Thread(target=lambda: health.append(client.get("/healthz")), daemon=True)
        prober.start()
        prober.join(WAIT_S)
        answered_during_render = bool(health) and not collector.release.is_set()
        collector.release.set()
        for scraper in scrapers:
            scraper.join(WAIT_S)
        assert answered_during_render, "/healthz waited for the /metrics render"
        assert health[0].status_code == 200
        assert [s.status_code for s in scrapes] == [200, 200]
        assert all("cgserve_test_blocking 1.0" in s.text for s in scrapes)
