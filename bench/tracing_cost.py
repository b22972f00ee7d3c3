"""What tracing costs the request path: DataPlane.infer on a stub queue, and the Batcher on a fake engine.

    .venv/bin/python bench/tracing_cost.py off|on [--repeat 7]

`off` is the default settings; `on` is tracing into the SDK's in-memory exporter (no I/O: the cost of
making the spans, not of sending them). For "before this change" run the same script with the code
of the commit before it on PYTHONPATH (the mode is then ignored: that code has no tracing):

    git worktree add /tmp/before <commit>; PYTHONPATH=/tmp/before .venv/bin/python bench/tracing_cost.py off

Prints one JSON line: Python calls per request (sys.setprofile: function and builtin calls) and the
best of `--repeat` runs of 10,000 requests, in µs per request, for each of the two paths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

N = 10_000
ENDPOINT = "http://127.0.0.1:4318/v1/traces"


class Stub:
    """A codec, a served model and its queue, all answered at once: only the data plane's own work is timed."""

    spec = SimpleNamespace(name="m")
    engines = (SimpleNamespace(name="stub"),)
    images = np.zeros((1, 1, 28, 28), np.uint8)

    def __init__(self, protocol: str = "rest") -> None:
        self.protocol = protocol  # the metrics' label, and the request span's naming (grpc: the method)
        self.admitted = 0  # the served model's count of requests admitted and not yet answered

    def served(self, model: str, version: str | None) -> Any:
        return self

    def ready_batcher(self) -> Any:
        return self

    def admit(self, deadline: float) -> None:
        pass

    def enqueue(self, images: np.ndarray, deadline: float) -> asyncio.Future[np.ndarray]:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        future.set_result(images)
        return future

    async def decode(self, request: Any, spec: Any) -> tuple[np.ndarray, Any]:
        return self.images, None

    def encode(self, scores: np.ndarray, asked: Any, served: Any, engine: str) -> str:
        return "answer"


async def read() -> bytes:
    return b""


def calls(run: Any) -> int:
    """Python and builtin calls made while `run()` runs."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


async def plane_requests(plane: Any, stub: Stub, n: int) -> None:
    for _ in range(n):
        await plane.infer(stub, read, model="m", version=None, form="raw", deadline=1e18, path="/predict")


async def batcher_requests(batcher: Any, n: int, per_batch: int = 8) -> None:
    """n requests, `per_batch` queued together each time (one batch of the fake engine's bucket 8)."""
    from tests.unit.fake_engine import images

    one = images(0.5)  # (1, 1, 2, 2) float32: the fake engine's shape
    for _ in range(n // per_batch):
        await asyncio.gather(*(batcher.submit(one) for _ in range(per_batch)))


def best_us(loop: asyncio.AbstractEventLoop, make: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        loop.run_until_complete(make(N))
        best = min(best, time.perf_counter() - started)
    return best / N * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("off", "on"))
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests.unit.fake_engine; PYTHONPATH goes first
    import app.dataplane
    from app.batching.batcher import Batcher
    from app.dataplane import DataPlane
    from tests.unit.fake_engine import FakeEngine

    before = not hasattr(app.dataplane, "tracing")
    if not before and args.mode == "on":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from app.ops import tracing

        exporter = InMemorySpanExporter()
        tracing.configure("console", ENDPOINT, exporter=exporter)
    settings = SimpleNamespace(tracing="console" if args.mode == "on" else "off", otlp_endpoint=ENDPOINT)
    plane = DataPlane(SimpleNamespace(settings=settings))  # type: ignore[arg-type]
    stub = Stub()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def made() -> Any:
        batcher = Batcher(FakeEngine((1, 2, 4, 8)), max_delay_s=60, queue_limit=1024, request_timeout_s=60)
        batcher.start()
        return batcher

    batcher = loop.run_until_complete(made())
    loop.run_until_complete(plane_requests(plane, stub, 100))  # warm
    loop.run_until_complete(batcher_requests(batcher, 800))
    figures = {
        "code": "before" if before else args.mode,
        "python": sys.version.split()[0],
        "plane_calls_per_request": calls(lambda: loop.run_until_complete(plane_requests(plane, stub, 1))),
        "plane_us_per_request": round(best_us(loop, lambda n: plane_requests(plane, stub, n), args.repeat), 3),
        "batcher_calls_per_8_requests": calls(lambda: loop.run_until_complete(batcher_requests(batcher, 8))),
        "batcher_us_per_request": round(best_us(loop, lambda n: batcher_requests(batcher, n), args.repeat), 3),
    }
    loop.run_until_complete(batcher.stop())
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
