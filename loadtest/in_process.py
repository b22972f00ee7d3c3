"""An ASGI app driven in-process: no sockets, no uvicorn. For what HTTP would blur: the app's own
cost per request (bench/history/asgi_path_bench.py, bench/instructions_per_request.py) and what a request
leaves behind (tests/api/test_no_cyclic_garbage.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson

JSON_BODY = orjson.dumps({"instances": [[[[0.5] * 28] * 28]]})  # one seed-CNN image as JSON
RAW_BODY = np.full((1, 1, 28, 28), 7, np.uint8).tobytes()  # and as raw uint8 pixels
MEDIA = {"json": b"application/json", "raw": b"application/octet-stream"}


def post_scope(body: bytes, media: bytes, path: str = "/predict") -> dict[str, Any]:
    """The ASGI scope of a POST of `body` as `media` to `path` (a fresh "state" is added per request)."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"in-process"), (b"content-type", media), (b"content-length", b"%d" % len(body))],
    }  # fmt: skip


async def post(app: Any, scope: dict[str, Any], body: bytes) -> int:
    """One request through the ASGI app, its body in one message; the response's status."""
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app({**scope, "state": {}}, receive, send)
    return status


async def started(app: Any) -> asyncio.Task[None]:
    """Run the app's lifespan start-up (the service builds its engines there); the task holds it
    open until cancelled."""
    events: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    await events.put({"type": "lifespan.startup"})
    up = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            up.set()
        elif message["type"] == "lifespan.startup.failed":
            raise RuntimeError(message.get("message", "lifespan start-up failed"))

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, events.get, send))
    await up.wait()
    return task
