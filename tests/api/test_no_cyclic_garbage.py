"""The request path frees what it allocates by reference counting: no reference cycles.

A cycle per request is garbage only a collection frees, and the collector's cost grows with the
requests in flight (run 15's coarse timers briefly made six a request). Driven through the ASGI
app directly, not a test client, so that only the service's own objects are counted."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import orjson

from app.config import Settings
from app.main import create_app

ROUNDS = 100
BODIES = {
    b"application/json": orjson.dumps({"instances": [[[[0.5] * 28] * 28]]}),
    b"application/octet-stream": np.full((1, 1, 28, 28), 7, np.uint8).tobytes(),
}


async def post(app: Any, media: bytes, body: bytes) -> int:
    status = 0
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/predict", "raw_path": b"/predict", "query_string": b"", "root_path": "", "state": {},
        "headers": [(b"host", b"test"), (b"content-type", media), (b"content-length", b"%d" % len(body))],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def cyclic_objects_after_requests() -> int:
    app = create_app(Settings(grpc_port=0, log_level="warning"))
    events: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    await events.put({"type": "lifespan.startup"})
    up = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        up.set()

    lifespan = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, events.get, lifespan_send)
    )
    await up.wait()
    await app.state.service.wait_started()
    for media, body in BODIES.items():  # warm: first-use caches are not per-request garbage
        assert await post(app, media, body) == 200
    gc.collect()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            results = await asyncio.gather(
                *(post(app, media, body) for media, body in BODIES.items() for _ in range(4))
            )
            assert set(results) == {200}
        return gc.collect()
    finally:
        gc.enable()
        lifespan.cancel()


def test_requests_leave_no_reference_cycles() -> None:
    found = asyncio.run(cyclic_objects_after_requests())
    assert found < ROUNDS, f"{found} objects in reference cycles after {ROUNDS * 8} requests"
