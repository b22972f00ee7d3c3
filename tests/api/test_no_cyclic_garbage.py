"""The request path frees what it allocates by reference counting: no reference cycles.

A cycle per request is garbage only a collection frees, and the collector's cost grows with the
requests in flight (run 15's coarse timers briefly made six a request). Driven through the ASGI
app directly (loadtest/in_process.py), not a test client, so that only the service's own
objects are counted."""

from __future__ import annotations

import asyncio
import gc

from app.config import Settings
from app.main import create_app
from loadtest import in_process
from loadtest.in_process import MEDIA, post, post_scope, started

ROUNDS = 100
REQUESTS = [
    (post_scope(in_process.JSON_BODY, MEDIA["json"]), in_process.JSON_BODY),
    (post_scope(in_process.RAW_BODY, MEDIA["raw"]), in_process.RAW_BODY),
]


async def cyclic_objects_after_requests() -> int:
    app = create_app(Settings(grpc_port=0, log_level="warning"))
    lifespan = await started(app)
    await app.state.service.wait_started()
    for scope, body in REQUESTS:  # warm: first-use caches are not per-request garbage
        assert await post(app, scope, body) == 200
    gc.collect()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            results = await asyncio.gather(*(post(app, scope, body) for scope, body in REQUESTS for _ in range(4)))
            assert set(results) == {200}
        return gc.collect()
    finally:
        gc.enable()
        lifespan.cancel()


def test_requests_leave_no_reference_cycles() -> None:
    found = asyncio.run(cyclic_objects_after_requests())
    assert found < ROUNDS, f"{found} objects in reference cycles after {ROUNDS * 8} requests"
