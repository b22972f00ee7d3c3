"""The tuner's lone requests leave a slow start out of the overhead (app/tuning/overhead.py).

A stand-in HTTP server answers slowly for its first second, as a fresh server did on the H200
(runs 13d-e), then at once, and notes which answers were slow; the requests the tuner measures
after its warm-up must all be fast ones. (The server's record decides, not a latency bound.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from app.tuning.overhead import WARMUP_REQUESTS, _lone_requests
from loadtest.lean_driver import request_bytes

SLOW_FOR_S = 1.0  # the stand-in's slow start
SLOW_ANSWER_S = 0.02  # how long each answer takes during it
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def measured(warmup_s: float, count: int = 20) -> tuple[list[float], list[bool]]:
    """The latencies the tuner kept, and for every answer the server gave, in order, whether it was slow."""
    first_request: list[float] = []
    slow: list[bool] = []
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.lower().split(b"\r\n")
                await reader.readexactly(next(int(line.split(b":")[1]) for line in lines if b"content-length" in line))
                first_request[:] = first_request or [time.monotonic()]
                slow.append(time.monotonic() - first_request[0] < SLOW_FOR_S)
                if slow[-1]:
                    await asyncio.sleep(SLOW_ANSWER_S)
                writer.write(ANSWER)
                await writer.drain()
        except asyncio.IncompleteReadError:  # the client closed its connection
            pass

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    request = request_bytes("POST", "127.0.0.1", port, "/predict", "application/octet-stream", b"\x00" * 784)
    try:
        return await _lone_requests("127.0.0.1", port, request, count, warmup_s), slow
    finally:
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await server.wait_closed()


def test_the_warm_up_waits_out_a_slow_start() -> None:
    latencies, slow = asyncio.run(measured(warmup_s=SLOW_FOR_S + 0.3))
    assert len(latencies) == 20
    assert any(slow) and not any(slow[-20:]), slow


def test_without_a_timed_warm_up_the_slow_start_is_measured() -> None:
    # The counted warm-up alone (WARMUP_REQUESTS slow answers) ends inside the slow start, so the
    # check above fails if the timed warm-up is ignored.
    assert WARMUP_REQUESTS * SLOW_ANSWER_S < SLOW_FOR_S / 2
    latencies, slow = asyncio.run(measured(warmup_s=0.0))
    assert len(latencies) == 20
    assert any(slow[-20:]), slow
