"""The tuner's lone requests leave a slow start out of the overhead (app/tuning/overhead.py).

A stand-in HTTP server answers slowly for its first second, as a fresh server did on the H200
(runs 13d-e), then at once, and notes which answers were slow; the requests the tuner measures
after its warm-up must all be fast ones. (The server's record decides, not a latency bound.)
"""

from __future__ import annotations

import asyncio
import contextlib
import socketserver
import threading
import time

from app.tuning.overhead import AFTER_THE_HOOK, WARMUP_REQUESTS, _batches, _lone_requests, _mean_batch_s, batch_totals
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


def test_the_warmed_hook_runs_once_between_the_warm_up_and_the_first_measured_request() -> None:
    # The tuner reads the server's batch histogram there: its batches then are the measured requests' only.
    calls: list[int] = []
    answered: list[float] = []

    async def measured_with_hook() -> list[float]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError):
                while head := await reader.readuntil(b"\r\n\r\n"):
                    lines = head.lower().split(b"\r\n")
                    await reader.readexactly(next(int(ln.split(b":")[1]) for ln in lines if b"content-length" in ln))
                    answered.append(time.monotonic())
                    writer.write(ANSWER)
                    await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        request = request_bytes("POST", "127.0.0.1", port, "/predict", "application/octet-stream", b"\x00" * 4)
        try:
            return await _lone_requests("127.0.0.1", port, request, 5, 0.0, warmed=lambda: calls.append(len(answered)))
        finally:
            server.close()

    latencies = asyncio.run(measured_with_hook())
    assert len(latencies) == 5
    assert calls == [WARMUP_REQUESTS]  # once, after every warm-up answer and before any measured one
    assert len(answered) == WARMUP_REQUESTS + AFTER_THE_HOOK + 5  # a few warm up again after the hook's pause


def test_the_batch_totals_sum_every_model_and_leave_other_families_out() -> None:
    text = "\n".join([
        "# HELP cgserve_batch_wall_seconds x",
        "# TYPE cgserve_batch_wall_seconds histogram",
        'cgserve_batch_wall_seconds_bucket{le="+Inf",model="a"} 3.0',
        'cgserve_batch_wall_seconds_count{model="a"} 3.0',
        'cgserve_batch_wall_seconds_sum{model="a"} 0.0015',
        'cgserve_batch_wall_seconds_bucket{le="+Inf",model="b"} 1.0',
        'cgserve_batch_wall_seconds_count{model="b"} 1.0',
        'cgserve_batch_wall_seconds_sum{model="b"} 0.0005',
        "# HELP cgserve_batch_compute_seconds the device's part only: not what the replay times",
        "# TYPE cgserve_batch_compute_seconds histogram",
        'cgserve_batch_compute_seconds_count{bucket="1",model="a"} 9.0',
        'cgserve_batch_compute_seconds_sum{bucket="1",model="a"} 9.0',
    ]) + "\n"  # fmt: skip
    total, count = batch_totals(text)
    assert count == 4 and abs(total - 0.002) < 1e-12
    assert batch_totals("") == (0.0, 0.0)
    assert _mean_batch_s((0.001, 2.0), (0.002, 4.0)) == 0.0005
    assert _mean_batch_s((0.001, 2.0), (0.001, 2.0)) is None  # no batch between: the replay stands in
    assert _mean_batch_s(None, (0.002, 4.0)) is None  # /metrics refused (admin tokens): the replay stands in


def test_a_metrics_page_that_refuses_leaves_the_replay_to_stand_in() -> None:
    # An admin token in .env makes /metrics answer 401 with JSON: the tuner goes on with the replay, not a traceback.
    with socketserver.TCPServer(("127.0.0.1", 0), _Refusing) as server:
        threading.Thread(target=server.handle_request, daemon=True).start()
        assert _batches(f"http://127.0.0.1:{server.server_address[1]}") is None


class _Refusing(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.rfile.readline()
        body = b'{"error":"a bearer token is required"}'
        self.wfile.write(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
