"""The service's request path in-process: its ASGI app driven directly, no sockets, no uvicorn.

    PYTHONPATH=. python3 bench/history/asgi_path_bench.py [--seconds 5] [--rounds 3] [--concurrency 64]

Not maintained: kept runnable for its one record (bench/results/2026-11-30-cpu-asgi-path.md, the
A/B of the request guard's timeouts). bench/instructions_per_request.py drives the same app in
process and counts instructions, which later records (2026-12-01-cpu-instructions-per-request.md)
use in place of this wall-clock figure.

What an HTTP benchmark on a noisy machine cannot resolve, this can: the app's own CPU per request
for `POST /predict` with one JSON image, the service (its real app, routes, guards, batcher and
metrics, with bench/proxy_server.py's stand-in engine: batches finish 80 µs after launch on a
timer) against the plain-route no-op's app (loadtest/servers/noop.py), each driven by
--concurrency request loops on one uvloop event loop, rounds interleaved. Everything both share
below the ASGI app (uvicorn's HTTP parsing, the sockets) is left out, so the µs difference is
exactly the service's extra work, and ours ÷ no-op here is lower than over HTTP. Run it pinned
to one core (taskset -c 0) and compare trees by running it in each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import uvloop  # noqa: E402
from proxy_server import TimerEngine  # noqa: E402

from app import service as service_module  # noqa: E402
from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from loadtest.in_process import JSON_BODY, MEDIA, post, post_scope, started  # noqa: E402
from loadtest.servers.noop import lean_app  # noqa: E402

BODY = JSON_BODY
SCOPE = post_scope(BODY, MEDIA["json"])


async def one_request(app: Any) -> int:
    """One POST /predict of BODY (SCOPE's headers) through the ASGI app; its status."""
    return await post(app, SCOPE, BODY)


async def requests_per_s(app: Any, seconds: float, concurrency: int) -> float:
    answered = 0
    until = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal answered
        while time.perf_counter() < until:
            status = await one_request(app)
            if status != 200:
                raise RuntimeError(f"answered {status}")
            answered += 1

    begun = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return answered / (time.perf_counter() - begun)


async def main(args: argparse.Namespace) -> None:
    service_module.build_engine = lambda model, options, *, in_flight, **_: TimerEngine(  # type: ignore[assignment]
        80e-6, options.buckets, in_flight
    )
    ours = create_app(Settings(grpc_port=0, log_level="warning"))  # type: ignore[call-arg]
    apps = {name: app for name, app in (("ours", ours), ("no-op", lean_app)) if name in args.apps.split(",")}
    lifespans = [await started(app) for app in apps.values()]
    if "ours" in apps:
        await ours.state.service.wait_started()
    for app in apps.values():  # warm: past the first seconds' slowness
        await requests_per_s(app, args.seconds, args.concurrency)
    rates: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(args.rounds):
        for name, app in apps.items():
            rates[name].append(await requests_per_s(app, args.seconds, args.concurrency))
    for name, values in rates.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{name:6s} {median:9,.0f} req/s  {1e6 / median:6.1f} µs/request  (rounds: {rounds})")
    if len(rates) == 2:
        ours_us, noop_us = (1e6 / statistics.median(rates[n]) for n in ("ours", "no-op"))
        print(f"ours ÷ no-op {noop_us / ours_us:.2f}; the service's extra work {ours_us - noop_us:.1f} µs/request")
    for task in lifespans:
        task.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--apps", default="ours,no-op", help="which apps to drive (default both; one for a profile)")
    uvloop.run(main(parser.parse_args()))
