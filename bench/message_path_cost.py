"""What a gRPC request costs the event loop on its way through the data plane, by coroutine and by callbacks.

A request read whole (a gRPC call's or a stream's message) went through `DataPlane.infer`: a task for
each streamed request, four coroutines deep (the stream's, the servicer's, the data plane's, the
codec's decode), and an asynchronous timeout around its decode and wait. `DataPlane.infer_message`
takes it by callbacks on the batcher's future, as app/http/inline.py takes a small HTTP request. Here
both run as ModelStreamInfer runs them (app/protocols/v2/stream_answers.py's answer_stream, one stream of
`--requests` requests) in one process, with a codec, model and queue that answer at once (the queue's
future set on the loop's next turn), so that only the path's own work is counted:

    calls_per_request   Python and builtin calls a request (sys.setprofile): the same on any machine
    us_per_request      the best of --repeat runs, µs a request: this machine's, noisy where it is shared

    PYTHONPATH=. .venv/bin/python bench/message_path_cost.py [--requests 10000 --repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from app.config import Settings
from app.dataplane import DataPlane
from app.protocols.v2.stream_answers import answer_stream
from bench.tracing_cost import calls

IMAGES = np.zeros((1, 1, 28, 28), np.uint8)
SCORES = np.ones((1, 10), np.float32)


class Stub:
    """A codec, its served model and the model's queue in one, each answered at once."""

    protocol = "grpc"
    spec = SimpleNamespace(name="m")
    engines = (SimpleNamespace(name="stub"),)

    def __init__(self) -> None:
        self.admitted = 0

    def served(self, model: str, version: str | None) -> Any:
        return self

    def ready_batcher(self) -> Any:
        return self

    def admit(self, deadline: float) -> None:
        pass

    def enqueue(self, images: np.ndarray, deadline: float) -> asyncio.Future[np.ndarray]:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, SCORES)  # as a batch would, later
        return future

    async def submit(self, images: np.ndarray, deadline: float) -> np.ndarray:
        return await self.enqueue(images, deadline)

    def decode_cheaply(self, message: Any, spec: Any) -> tuple[np.ndarray, Any]:
        return IMAGES, None

    async def decode(self, message: Any, spec: Any) -> tuple[np.ndarray, Any]:
        return IMAGES, None

    def encode(self, scores: np.ndarray, asked: Any, served: Any, engine: str) -> str:
        return "answer"


def answers(plane: DataPlane, stub: Stub, path: str) -> Callable[[int], Awaitable[Any]]:
    """The stream's `answer` for each path: a coroutine (run as a task a request), or the data plane's future."""
    far = time.monotonic() + 3600

    if path == "coroutine":

        async def infer(request: int) -> Any:
            async def read() -> int:
                return request

            return await plane.infer(stub, read, model="m", version=None, form="raw", deadline=far, path="Stream")

        return infer

    def infer_message(request: int) -> asyncio.Future[Any]:
        return plane.infer_message(stub, request, model="m", version=None, form="raw", deadline=far, path="Stream")

    return infer_message


async def stream(answer: Callable[[int], Awaitable[Any]], n: int) -> None:
    async def requests() -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async for _ in answer_stream(requests(), answer, 256):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    plane = DataPlane(SimpleNamespace(settings=Settings()))  # type: ignore[arg-type]
    stub = Stub()
    loop = asyncio.new_event_loop()
    figures: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "python": sys.version.split()[0]}
    for path in ("coroutine", "callbacks"):
        answer = answers(plane, stub, path)
        loop.run_until_complete(stream(answer, 1000))  # warm
        counted = calls(lambda answer=answer: loop.run_until_complete(stream(answer, 1000)))  # type: ignore[misc]
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            loop.run_until_complete(stream(answer, args.requests))
            best = min(best, time.perf_counter() - started)
        figures[path] = {
            "calls_per_request": round(counted / 1000, 1),
            "us_per_request": round(best / args.requests * 1e6, 2),
        }
    loop.close()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
