"""A real scrape: the service and a Prometheus server on loopback, with the repository's own
Prometheus configuration (target rewritten to the test's port, 1 s scrape and rule evaluation).

Passes when Prometheus can compute the p99 of the request-latency histogram from what it scraped,
every recording rule has a value, and every rule evaluates without error.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
P99 = "histogram_quantile(0.99, sum by (le) (rate(cgserve_request_duration_seconds_bucket[1m])))"
START_TIMEOUT_S = 120.0  # the service's start-up (CPU: seconds; GPU: graph capture) and Prometheus'
QUERY_TIMEOUT_S = 60.0  # until the p99 and every recording rule have values


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def executable(name: str, hint: str) -> str:
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if beside_python.is_file() else shutil.which(name)
    if found is None:
        message = f"{name} not found: {hint}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the scrape test must run)")
        pytest.skip(message)
    return found


def log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_until_ok(proc: subprocess.Popen[bytes], url: str, log: Path, what: str) -> None:
    """Poll `url` until it answers 200; fail with the log if the process exits or time runs out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before {url} answered 200:\n{log_tail(log)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"{what}: {url} did not answer 200 within {START_TIMEOUT_S:.0f} s:\n{log_tail(log)}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    """The real service on a free loopback port; yields its base URL; always stopped."""
    command = executable("cudagraph-serve", "pip install . (the project's console script)")
    port = free_port()
    log = tmp_path / "service.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [command, "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,  # no stray .env from the checkout
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ok(proc, f"{url}/readyz", log, "cudagraph-serve")
        yield url
    finally:
        stop(proc)


def loopback_config(service_port: int, tmp_path: Path) -> Path:
    """deploy/prometheus/prometheus.yml with the target on loopback, 1 s intervals, absolute rule paths."""
    source = REPO / "deploy/prometheus/prometheus.yml"
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(source.parent / pattern) for pattern in config["rule_files"]]
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "cgserve"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{service_port}"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def prometheus(service: str, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping `service`; yields its base URL; always stopped."""
    binary = executable("prometheus", "install Debian's `prometheus` package (apt-get install prometheus)")
    port = free_port()
    config = loopback_config(int(service.rsplit(":", 1)[1]), tmp_path)
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ok(proc, f"{url}/-/ready", log, "prometheus")
        yield url
    finally:
        stop(proc)


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
    wanted = [P99, *recording_rules()]
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

    # Every rule, alerts included, was evaluated without error.
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["name"] for rule in rules} >= {"CgserveHighP99Latency", "CgserveRejections", "CgserveNotReady"}
    unhealthy = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert not unhealthy, unhealthy
    firing = [rule["name"] for rule in rules if rule.get("state") == "firing"]
    assert not firing, f"alerts firing on a healthy service: {firing}"
