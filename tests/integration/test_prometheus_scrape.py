"""A real scrape: the service and a Prometheus server on loopback, with the repository's own
Prometheus configuration (target rewritten to the test's port, 1 s scrape and rule evaluation).

Passes when Prometheus can compute the p99 of the request-latency histogram from what it scraped,
every recording rule has a value, every rule evaluates without error, and the autoscaling query of
deploy/k8s (KEDA's Prometheus trigger, read from the manifest) returns the one number KEDA needs.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadtest.server_process import HOST, free_port, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
P99 = "histogram_quantile(0.99, sum by (le) (rate(cgserve_request_duration_seconds_bucket[1m])))"
K8S_BASE = REPO / "deploy/k8s/base"
START_TIMEOUT_S = 120.0  # the service's start-up (CPU: seconds; GPU: graph capture) and Prometheus'
QUERY_TIMEOUT_S = 60.0  # until the p99 and every recording rule have values


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        message = "prometheus not found: install Debian's `prometheus` package (apt-get install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the scrape test must run)")
        pytest.skip(message)
    return found


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    """The real service on a free loopback port; yields its base URL; always stopped."""
    port = free_port()
    argv = [sys.executable, "-m", "app.cli", "serve", "--host", HOST, "--port", str(port), "--drain-seconds", "0.1"]
    # cwd: no stray .env from the checkout
    with running(argv, tmp_path / "service.log", port=port, ready_timeout_s=START_TIMEOUT_S, cwd=tmp_path) as server:
        yield server.url


def autoscaling_query() -> str:
    """The PromQL of the ScaledObject's Prometheus trigger, as deploy/k8s ships it."""
    scaled = yaml.safe_load((K8S_BASE / "scaledobject.yaml").read_text())
    (trigger,) = [trigger for trigger in scaled["spec"]["triggers"] if trigger["type"] == "prometheus"]
    query: str = trigger["metadata"]["query"]
    return query


def operator_labels() -> dict[str, str]:
    """What the Prometheus Operator adds to a pod it scrapes, beyond job (the Service's name, cgserve,
    as tests/deploy checks): its namespace, the kustomization's."""
    kustomization = yaml.safe_load((K8S_BASE / "kustomization.yaml").read_text())
    return {"namespace": kustomization["namespace"], "pod": "cgserve-0"}


def loopback_config(service_port: int, tmp_path: Path) -> Path:
    """deploy/prometheus/prometheus.yml with the target on loopback (labelled as in Kubernetes), 1 s
    intervals, absolute rule paths."""
    source = REPO / "deploy/prometheus/prometheus.yml"
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(source.parent / pattern) for pattern in config["rule_files"]]
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "cgserve"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{service_port}"], "labels": operator_labels()}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def prometheus(service: str, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping `service`; yields its base URL; always stopped."""
    port = free_port()
    config = loopback_config(int(service.rsplit(":", 1)[1]), tmp_path)
    argv = [
        prometheus_binary(),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address={HOST}:{port}",
    ]
    log = tmp_path / "prometheus.log"
    with running(argv, log, port=port, ready_timeout_s=START_TIMEOUT_S, ready_path="/-/ready", cwd=tmp_path) as server:
        yield server.url


def query(prometheus: str, expr: str) -> list[float]:
    """Values of an instant query's result (empty where it has no series)."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    return [float(sample["value"][1]) for sample in answer["data"]["result"]]


def recording_rules() -> list[str]:
    names = []
    for path in sorted((REPO / "deploy/prometheus/rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [rule["record"] for rule in group["rules"] if "record" in rule]
    return names


def test_prometheus_scrapes_the_service_and_evaluates_the_rules(service: str, prometheus: str) -> None:
    rng = random.Random(0)
    wanted = [P99, autoscaling_query(), *recording_rules()]
    missing: list[str] = wanted
    sent = 0
    with httpx.Client(base_url=service, timeout=10) as client:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while missing and time.monotonic() < deadline:
            # Keep traffic flowing while waiting: rate() needs the counters to grow between scrapes.
            for _ in range(5):
                rows = rng.choice((1, 2, 3))
                body = {"instances": [[round(rng.random(), 3) for _ in range(784)] for _ in range(rows)]}
                answer = client.post("/predict", json=body)
                assert answer.status_code == 200, answer.text
                assert len(answer.json()["predictions"]) == rows
                sent += 1
            # The rejections rule has a value only once something was rejected: send one invalid body.
            assert 400 <= client.post("/predict", json={"instances": [[0.5] * 10]}).status_code < 500
            missing = [expr for expr in wanted if not any(math.isfinite(v) for v in query(prometheus, expr))]
            time.sleep(0.5)
    assert not missing, f"no finite value after {QUERY_TIMEOUT_S:.0f} s and {sent} requests for: {missing}"
    assert query(prometheus, 'up{job="cgserve"}') == [1.0]
    assert query(prometheus, 'cgserve_ready{job="cgserve"}') == [1.0]
    # KEDA's Prometheus scaler needs exactly one sample: the rows waiting, summed over the pods.
    (rows,) = query(prometheus, autoscaling_query())
    assert math.isfinite(rows) and rows >= 0  # a number KEDA can divide, not NaN or a negative

    # Every rule, alerts included, was evaluated without error.
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["name"] for rule in rules} >= {"CgserveHighP99Latency", "CgserveRejections", "CgserveNotReady"}
    unhealthy = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert not unhealthy, unhealthy
    firing = [rule["name"] for rule in rules if rule.get("state") == "firing"]
    assert not firing, f"alerts firing on a healthy service: {firing}"
