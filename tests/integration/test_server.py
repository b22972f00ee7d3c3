"""The real server process, started with README's command, answering real concurrent clients."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from models.cnn import load_model
from tests.integration.server_process import running_server, settled_metrics

CONCURRENT = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("server") / "server.log", max_delay_ms="2") as url:
        yield url


def test_concurrent_requests_each_get_the_eager_answer_for_their_own_input(server: str) -> None:
    rng = np.random.default_rng(7)
    # Requests of 1–3 images, so batches mix request sizes and split across buckets.
    inputs = [rng.random((int(rng.integers(1, 4)), 784), dtype=np.float32) for _ in range(CONCURRENT)]

    async def send_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=CONCURRENT)
        async with httpx.AsyncClient(base_url=server, limits=limits, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/predict",
                        content=orjson.dumps({"instances": x}, option=orjson.OPT_SERIALIZE_NUMPY),
                        headers={"content-type": "application/json"},
                    )
                    for x in inputs
                )
            )

    answers = asyncio.run(send_all())
    module = load_model()  # from models/ alone, independent of the service's model spec
    for x, answer in zip(inputs, answers, strict=True):
        assert answer.status_code == 200, answer.text
        with torch.inference_mode():
            want = torch.softmax(module(torch.from_numpy(x).reshape(-1, 1, 28, 28)), dim=1).numpy()
        got = np.array([p["scores"] for p in answer.json()["predictions"]], dtype=np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    metrics = httpx.get(f"{server}/metrics").text
    batches = sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("cgserve_batches_total{"))
    assert 0 < batches < CONCURRENT  # concurrent requests were batched together


def test_bad_request_to_the_real_server_leaves_it_serving(server: str) -> None:
    bad = httpx.post(f"{server}/predict", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    good = httpx.post(f"{server}/predict", json={"instances": [[0.0] * 784]})
    assert good.status_code == 200


def test_invalid_setting_stops_start_up_with_what_to_fix(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match=r"CGSERVE_BUCKETS / --buckets: .*positive"),
        running_server(tmp_path / "bad.log", buckets="0,4"),
    ):
        pass


def test_clients_that_disconnect_mid_request_do_not_disturb_the_others(server: str) -> None:
    body = orjson.dumps({"instances": [[0.5] * 784] * 4})
    headers = {"content-type": "application/json"}

    async def leave_early(client: httpx.AsyncClient) -> None:
        # Sends the request, then gives up before the answer can come: the connection closes.
        with contextlib.suppress(httpx.TimeoutException):
            await client.post("/predict", content=body, headers=headers, timeout=0.0005)

    async def run() -> list[httpx.Response]:
        async with (
            httpx.AsyncClient(base_url=server, limits=httpx.Limits(max_connections=100)) as impatient,
            httpx.AsyncClient(base_url=server, limits=httpx.Limits(max_connections=100), timeout=60) as patient,
        ):
            answers = await asyncio.gather(
                *(leave_early(impatient) for _ in range(50)),
                *(patient.post("/predict", content=body, headers=headers) for _ in range(50)),
            )
        return [a for a in answers if a is not None]

    answers = asyncio.run(run())
    assert len(answers) == 50 and all(a.status_code == 200 for a in answers)
    assert all(len(a.json()["predictions"]) == 4 for a in answers)
    assert httpx.get(f"{server}/readyz").status_code == 200


def test_several_workers_share_the_port_and_merge_their_metrics(tmp_path: Path) -> None:
    with running_server(tmp_path / "workers.log", workers="2") as url:
        for _ in range(40):  # new connections, so both workers take some
            assert httpx.post(f"{url}/predict", json={"instances": [[0.0] * 784]}).status_code == 200
        exposition = settled_metrics(url)  # several processes: each flushes its own
        workers = worker_pids(url.rsplit(":", 1)[1])
    served = sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "cgserve_requests_total" and sample.labels["code"] == "200"
    )
    assert served == 40  # whichever worker answered /metrics counted every worker's requests
    memory = {  # the multiprocess mode has no process_* of its own: each live worker's, by pid
        int(sample.labels["pid"])
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "process_resident_memory_bytes" and sample.value > 0
    }
    assert len(workers) == 2 and workers <= memory, (workers, memory)


def worker_pids(port: str) -> set[int]:
    """The server's worker processes (multiprocessing's spawned children), by the port in their environment."""
    found = set()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and b"spawn_main" in (proc / "cmdline").read_bytes() and (
                    f"CGSERVE_PORT={port}".encode() in (proc / "environ").read_bytes().split(b"\0")):  # fmt: skip
                found.add(int(proc.name))
    return found


def gauge(url: str, name: str) -> float:
    line = next(line for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def test_a_worker_that_dies_leaves_the_live_gauges_when_it_is_replaced(tmp_path: Path) -> None:
    """A worker killed while draining (or starting, or under load) kept its last cgserve_ready 0 in /metrics'
    minimum for ever: the shipped alert fired against a ready server (the operator review)."""
    import os
    import signal
    import time

    with running_server(tmp_path / "workers.log", workers="2") as url:
        port = url.rsplit(":", 1)[1]
        first = worker_pids(port)
        assert len(first) == 2, first
        victim = min(first)
        os.kill(victim, signal.SIGTERM)  # it drains: its readiness, and its cgserve_ready, 0
        deadline = time.monotonic() + 30
        while gauge(url, "cgserve_ready") != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gauge(url, "cgserve_ready") == 0
        os.kill(victim, signal.SIGKILL)  # gone before it ends: uvicorn's manager replaces it
        while (len(worker_pids(port) - first) < 1 or httpx.get(f"{url}/readyz").status_code != 200) and (
                time.monotonic() < deadline + 60):  # fmt: skip
            time.sleep(0.2)
        assert httpx.get(f"{url}/readyz").status_code == 200
        time.sleep(1.5)  # the manager's next look at its workers (twice a second)
        assert gauge(url, "cgserve_ready") == 1
