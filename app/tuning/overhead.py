"""The service's per-request overhead: the real server at low load, less the engine's replay.

Chosen over an in-process model of the HTTP path because what the SLO bounds is what a client
sees: uvicorn's parsing, the route, decoding, admission, the batcher's hand-offs, encoding and
the client's own socket round trip are all in it, and none of them can be left out by mistake.
The server runs the same settings as the tuner (repository, device, engine, dtype, compile
cache) with only the smallest bucket and max delay 0, so that a lone request is one batch of
that bucket at once; requests are sent one at a time (no queueing, no batching), and

    overhead = latency of a request − a batch's time (≥ 0)

median and p99 over the requests after a warm-up. A batch's time is what the queueing model adds
back: the tuner's replay, `await engine.run` timed in the tuner's process (measure.py). Two
estimates of it, each biased only upward, and the smaller is taken: the replay's median, slow
where the machine was busier while the tuner timed it (beside a test suite, 0.6–0.9 ms where the
server's histogram gave its forward call 0.48, and every request's overhead read 0); and the
overhead server's own mean
cgserve_batch_wall_seconds over the measured requests (launch to answers handed back), which also
holds the batch task's wait for its loop and, as a mean, its outliers (0.44–0.66 ms against the
replay's 0.31–0.33 on an idle machine: bench/results/2026-12-06-cpu-tuner-overhead.md).

A model.toml that sets its own buckets keeps them on that server: the overhead then also holds its
padding.

The client is the load generator's lean connection: each request in one write, TCP_NODELAY,
the client the benchmarks measure with. A fresh server answers its first few seconds slowly,
which the warm-up waits out.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.ops.metric_buffers import FLUSH_S
from app.tuning.choose import Timing
from app.tuning.measure import timing_of
from loadtest.lean_driver import LeanConnection, request_bytes
from loadtest.server_process import HOST, free_port, running, service_env

# Lone requests before the measured ones: at least this many, for at least --overhead-warmup-s.
# A fresh server answers lone requests several times slower for its first seconds, whatever the
# client or event-wait mode (bench/lone_requests.py measures it); even a no-op server ramps up.
# The tuner plans for the steady state, so it waits the transient out with room to spare.
WARMUP_REQUESTS = 20
REQUEST_TIMEOUT_S = 30.0
# Warm-up requests again after `warmed` has left the server idle (a scrape): the first after a pause is slow.
AFTER_THE_HOOK = 5
BATCH_WALL = "cgserve_batch_wall_seconds"


def server_settings(overrides: Mapping[str, object]) -> dict[str, str]:
    """CGSERVE_* variables for the settings given as flags (None: not given), as a server reads them."""
    env = {}
    for name, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, tuple | list):
            text = ",".join(map(str, value))
        else:
            text = str(value)
        env[f"CGSERVE_{name.upper()}"] = text
    return env


def measure_overhead(
    *,
    model: str,
    input_shape: tuple[int, int, int],
    bucket: int,
    replay_median_s: float,
    settings_env: Mapping[str, str],
    requests: int,
    warmup_s: float,
    startup_timeout_s: float,
    token: str | None = None,
    admin_token: str | None = None,
) -> tuple[Timing, str]:
    """Timing of (request latency − a batch's time) over `requests` lone one-image raw uint8 requests, and
    which batch time was taken away (for the tuner's report). `token` and `admin_token`: bearer tokens for the
    requests and for /metrics, where the settings (or .env) set them."""
    if requests < 1:
        raise ValueError(f"overhead requests must be ≥ 1; got {requests}")
    port = free_port()
    env = {**settings_env, **service_env(port, buckets=bucket, max_delay_ms=0, workers=1)}
    body = np.random.default_rng(0).integers(0, 256, (1, *input_shape), dtype=np.uint8).tobytes()
    argv = [sys.executable, "-m", "app.cli", "serve"]
    with tempfile.TemporaryDirectory(prefix="cgserve-tune-") as folder:
        log_path = Path(folder) / "server.log"
        with running(argv, log_path, port=port, ready_timeout_s=startup_timeout_s, env=env, name="overhead server"):
            path = f"/v1/models/{model}/predict"
            bearer = (("Authorization", f"Bearer {token}"),) if token else ()
            request = request_bytes("POST", HOST, port, path, "application/octet-stream", body, bearer)
            url = f"http://{HOST}:{port}"
            before: list[tuple[float, float] | None] = []
            latencies = asyncio.run(
                _lone_requests(
                    HOST, port, request, requests, warmup_s, warmed=lambda: before.append(_batches(url, admin_token))
                )
            )
            server_batch_s = _mean_batch_s(before[0], _batches(url, admin_token))
    estimates = [(replay_median_s, "the median replay of its bucket")]
    if server_batch_s is not None:
        estimates.append((server_batch_s, "the server's own mean batch"))
    estimates.sort()  # the smaller first: the one taken away
    said = ", under ".join(f"{what} ({seconds * 1e3:.3f} ms)" for seconds, what in estimates)
    return timing_of([max(0.0, latency - estimates[0][0]) for latency in latencies]), said


def _batches(url: str, admin_token: str | None = None) -> tuple[float, float] | None:
    """(seconds, batches) the server's BATCH_WALL histogram holds so far, every model together; None where /metrics
    does not answer them (the replay then stands in). Read with the server idle, after what an engine process
    buffers (CGSERVE_ENGINE_PROCESS) has been handed to /metrics: its batcher flushes every FLUSH_S."""
    time.sleep(3 * FLUSH_S)
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    try:
        answer = httpx.get(f"{url}/metrics", headers=headers, timeout=REQUEST_TIMEOUT_S)
        return batch_totals(answer.text) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):  # ValueError: not Prometheus's text format
        return None


def batch_totals(metrics_text: str) -> tuple[float, float]:
    """(sum, count) of BATCH_WALL over its labels, from Prometheus's text format; (0, 0) where it is absent."""
    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name == BATCH_WALL:
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_count"):
                    count += sample.value
    return total, count


def _mean_batch_s(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """The mean batch between two readings of batch_totals; None where either is missing or no batch was counted."""
    if before is None or after is None:
        return None
    batches = after[1] - before[1]
    return (after[0] - before[0]) / batches if batches > 0 else None


async def _lone_requests(
    host: str, port: int, request: bytes, count: int, warmup_s: float, warmed: Callable[[], object] | None = None
) -> list[float]:
    """Seconds from write to whole answer of `count` requests sent one after another on one
    connection, after the warm-up (WARMUP_REQUESTS, and `warmup_s`) on the same connection;
    `warmed` is called (in a thread) once the warm-up is over, then AFTER_THE_HOOK more requests warm up again
    before the first measured one."""
    _, connection = await asyncio.get_running_loop().create_connection(LeanConnection, host, port)
    latencies: list[float] = []
    warm_until, warmups = time.perf_counter() + warmup_s, 0
    try:
        while len(latencies) < count:
            measured = warmups >= WARMUP_REQUESTS and time.perf_counter() >= warm_until
            if measured and not latencies and warmed is not None:
                await asyncio.to_thread(warmed)
                warmed, warmups = None, WARMUP_REQUESTS - AFTER_THE_HOOK  # a few more, after the hook's idle
                continue
            started = time.perf_counter()
            status, answer = await connection.exchange(request, REQUEST_TIMEOUT_S)
            finished = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"the overhead server answered {status}: {answer[:300].decode(errors='replace')}")
            if measured:
                latencies.append(finished - started)
            else:
                warmups += 1
    finally:
        if connection.transport is not None:
            connection.transport.close()
    return latencies
