"""The service's per-request overhead: the real server at low load, less the engine's replay.

Chosen over an in-process model of the HTTP path because what the SLO bounds is what a client
sees: uvicorn's parsing, the route, decoding, admission, the batcher's hand-offs, encoding and
the client's own socket round trip are all in it, and none of them can be left out by mistake.
The server runs the same settings as the tuner (repository, device, engine, dtype, compile
cache) with only the smallest bucket and max delay 0, so that a lone request is one batch of
that bucket at once; requests are sent one at a time (no queueing, no batching), and

    overhead = latency of a request − median replay of the smallest bucket (≥ 0)

median and p99 over the requests after a warm-up. A model.toml that sets its own buckets keeps
them on that server: the overhead then also holds its padding.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import numpy as np

from app.tuning.choose import Timing
from app.tuning.measure import timing_of

WARMUP_REQUESTS = 20


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
    startup_timeout_s: float,
) -> Timing:
    """Timing of (request latency − replay) over `requests` lone one-image raw uint8 requests."""
    from loadtest.server_process import HOST, free_port, running

    if requests < 1:
        raise ValueError(f"overhead requests must be ≥ 1; got {requests}")
    port = free_port()
    env = {**settings_env, "CGSERVE_HOST": HOST, "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0"}
    env |= {"CGSERVE_BUCKETS": str(bucket), "CGSERVE_MAX_DELAY_MS": "0", "CGSERVE_WORKERS": "1"}
    env |= {"CGSERVE_LOG_LEVEL": "warning"}
    body = np.random.default_rng(0).integers(0, 256, (1, *input_shape), dtype=np.uint8).tobytes()
    headers = {"content-type": "application/octet-stream"}
    argv = [sys.executable, "-m", "app.cli", "serve"]
    with tempfile.TemporaryDirectory(prefix="cgserve-tune-") as folder:
        log_path = Path(folder) / "server.log"
        with (
            running(
                argv, log_path, port=port, ready_timeout_s=startup_timeout_s, env=env, name="overhead server"
            ) as srv,
            httpx.Client(base_url=srv.url, timeout=30.0, trust_env=False) as client,
        ):
            samples = []
            for i in range(WARMUP_REQUESTS + requests):
                started = time.perf_counter()
                answer = client.post(f"/v1/models/{model}/predict", content=body, headers=headers)
                elapsed = time.perf_counter() - started
                if answer.status_code != 200:
                    raise RuntimeError(f"the overhead server answered {answer.status_code}: {answer.text[:300]}")
                if i >= WARMUP_REQUESTS:
                    samples.append(max(0.0, elapsed - replay_median_s))
    return timing_of(samples)
