"""Lone requests, one at a time: where the tail of an idle server's latency comes from.

    PYTHONPATH=. python3 bench/lone_requests.py --out DIR [--requests 500] [--device cuda]

The tuner's overhead (app/tuning/overhead.py) is the p99 of lone requests, and on the H200 machine
it found ~1 ms medians with ~48 ms maxima (run 13c). This separates the suspects, one run:
  servers  the plain-route no-op (loadtest/servers/noop.py --lean: the HTTP stack alone), and
           the service on the seed CNN (bucket 1, max delay 0, one worker) with each of its
           CGSERVE_EVENT_WAIT modes (poll, spin, block) on --device
  clients  `lean`: the request in one write (the load generator's connection, TCP_NODELAY);
           `split`: head and body in two writes, as httpx's sync client sends them
Each server: four phases one after another, lean, split, lean, split (run 13d ran lean then split
and found every first phase slow; run 13e's four phases showed it is the time since the server
became ready, not the client: the first 3-5 s are slow), each --requests raw uint8 requests of one
image to /predict after 20 warm-ups: median, p99, max, how many took over 10 ms and which; the
GPU's SM clock (nvidia-smi) and the seconds since the server was ready at each phase's start.
With --host-io-copy, the service once more with CGSERVE_HOST_IO=copy (no mapped pinned memory).
Writes DIR/lone-requests.json and prints a line per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from loadtest.lean_driver import LeanConnection, request_bytes  # noqa: E402
from loadtest.server_process import HOST, free_port, running, service_env  # noqa: E402
from loadtest.stats import percentile  # noqa: E402

WARMUP = 20
SLOW_S = 0.010


async def lone_latencies(port: int, request: bytes, count: int, split_at: int | None) -> list[float]:
    """Seconds per request, one after another on one keep-alive connection."""
    _, conn = await asyncio.get_running_loop().create_connection(LeanConnection, HOST, port)
    assert conn.transport is not None
    out = []
    try:
        for _ in range(WARMUP + count):
            started = time.perf_counter()
            if split_at is None:
                status, body = await conn.exchange(request, 30.0)
            else:  # the head now, the body on the next loop turn: two segments on the wire
                conn.transport.write(request[:split_at])
                await asyncio.sleep(0)
                status, body = await conn.exchange(request[split_at:], 30.0)
            out.append(time.perf_counter() - started)
            if status != 200:
                raise RuntimeError(f"answered {status}: {body[:200]!r}")
    finally:
        conn.transport.close()
    return out[WARMUP:]


def summary(latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round((percentile(np.asarray(ordered), 99) or 0.0) * 1e3, 3),  # nearest rank, as the tuner's
        "max_ms": round(ordered[-1] * 1e3, 3),
        "over_10ms": sum(1 for v in ordered if v > SLOW_S),
        # which requests (after the warm-ups) were slow, and how slow: a pattern in time names a cause
        "slow": [[i, round(v * 1e3, 1)] for i, v in enumerate(latencies) if v > SLOW_S][:20],
    }


def sm_clock_mhz() -> str | None:
    """The first GPU's SM clock now, as nvidia-smi reads it (None without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0"]
    return subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--waits", default="poll,spin,block", help="the service's CGSERVE_EVENT_WAIT modes")
    parser.add_argument("--host-io-copy", action="store_true", help="also the service with CGSERVE_HOST_IO=copy")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    body = np.random.default_rng(0).integers(0, 256, (1, 1, 28, 28), dtype=np.uint8).tobytes()
    noop = [sys.executable, "-m", "loadtest.servers.noop", "--lean", "--host", HOST]
    serve = [sys.executable, "-m", "app.cli", "serve"]
    servers: list[tuple[str, list[str], dict[str, object] | None]] = [("noop-lean", noop, None)]  # name, argv, settings
    base: dict[str, object] = {"device": args.device, "buckets": 1, "max_delay_ms": 0, "workers": 1, "compile": "none"}
    for wait in args.waits.split(","):
        servers.append((f"ours-{wait}", serve, {**base, "event_wait": wait}))
    if args.host_io_copy:
        servers.append(("ours-poll-copy", serve, {**base, "event_wait": "poll", "host_io": "copy"}))
    record: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "results": {}}
    with tempfile.TemporaryDirectory(prefix="lone-requests-") as folder:
        for name, argv, settings in servers:
            port = free_port()
            env = None if settings is None else service_env(port, **settings)
            argv = [*argv, "--port", str(port)] if settings is None else argv
            log = Path(folder) / f"{name}.log"
            with running(argv, log, port=port, env=env, cwd=ROOT, name=name, ready_timeout_s=180):
                ready = time.monotonic()
                request = request_bytes("POST", HOST, port, "/predict", "application/octet-stream", body)
                split_at = len(request) - len(body)
                for phase, (client, split) in enumerate([("lean", None), ("split", split_at)] * 2, 1):
                    start = {"since_ready_s": round(time.monotonic() - ready, 2), "sm_clock_mhz": sm_clock_mhz()}
                    result = start | summary(asyncio.run(lone_latencies(port, request, args.requests, split)))
                    record["results"][f"{name} {phase}-{client}"] = result
                    print(f"{name:14s} {phase}-{client:6s} {result}", flush=True)
    (args.out / "lone-requests.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
