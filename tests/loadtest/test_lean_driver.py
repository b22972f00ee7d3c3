"""The lean driver against small in-process servers that answer in the awkward ways a real one
may: split into pieces, closing after each answer, chunked, never. The real service and the
no-op server are driven by it in test_loadtest.py (every answer checked) and below beside httpx.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest

from loadtest.connections import TransportFailure
from loadtest.lean_driver import LeanDriver, ResponseHeadError, parse_head, request_bytes
from loadtest.payloads import Payloads

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
PAYLOADS = Payloads("raw", "/predict", "application/octet-stream", (b"\x01\x02\x03", b"\x04"), None, 1)
OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


def test_parse_head_frames_what_servers_send_and_refuses_the_rest() -> None:
    assert parse_head(b"HTTP/1.1 200 OK\r\nServer: uvicorn\r\nContent-Length: 17") == (200, 17, True)
    assert parse_head(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 5\r\nconnection: close") == (503, 5, False)
    assert parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 3") == (200, 3, False)
    assert parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive") == (200, 3, True)
    assert parse_head(b"HTTP/1.1 204 No Content") == (204, 0, True)
    refused = {
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked": "chunked",
        b"HTTP/1.1 200 OK\r\nServer: x": "without Content-Length",
        b"HTTP/1.1 100 Continue": "interim",
        b"SSH-2.0-OpenSSH_9.6": "status line",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1": "not a number",
    }
    for head, words in refused.items():
        with pytest.raises(ResponseHeadError, match=words):
            parse_head(head)


def test_request_bytes_are_one_whole_request() -> None:
    wire = request_bytes("POST", "::1", 8000, "/predict?dtype=float32", "application/octet-stream", b"abc")
    head, _, body = wire.partition(b"\r\n\r\n")
    assert body == b"abc" and head.startswith(b"POST /predict?dtype=float32 HTTP/1.1\r\nHost: [::1]:8000\r\n")
    assert b"\r\nContent-Length: 3" in head and b"\r\nContent-Type: application/octet-stream" in head


async def _with_server(handler: Handler, requests: int, *, connections: int = 1, timeout_s: float = 5.0) -> list:
    """Send `requests` requests one after another through a LeanDriver; each (status, body) or
    the TransportFailure."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    driver = LeanDriver(f"http://127.0.0.1:{port}", PAYLOADS, connections=connections, timeout_s=timeout_s)
    out: list = []
    try:
        for i in range(requests):
            try:
                out.append(await driver.send(i % 2))
            except TransportFailure as failure:
                out.append(failure)
    finally:
        await driver.aclose()
        server.close()
    return out


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (the driver always sends Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


def test_answers_split_into_pieces_are_reassembled_on_one_connection() -> None:
    accepted = []

    async def byte_by_byte(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            answer = OK_HEAD.replace(b"length: 2", f"length: {len(body)}".encode()) + body
            for i in range(len(answer)):  # one byte per write: the driver must wait for all of it
                writer.write(answer[i : i + 1])
                await writer.drain()

    out = asyncio.run(_with_server(byte_by_byte, 4))
    assert out == [(200, b"\x01\x02\x03"), (200, b"\x04"), (200, b"\x01\x02\x03"), (200, b"\x04")]
    assert len(accepted) == 1  # keep-alive: one connection for all four


def test_connection_close_answers_are_followed_by_a_new_connection() -> None:
    accepted = []

    async def close_after_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await _read_request(reader)
        writer.write(OK_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + b"{}")
        writer.close()

    out = asyncio.run(_with_server(close_after_each, 3))
    assert out == [(200, b"{}")] * 3 and len(accepted) == 3


def test_chunked_answers_are_refused_with_the_way_out() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        await writer.drain()

    (failure,) = asyncio.run(_with_server(chunked, 1))
    assert isinstance(failure, TransportFailure) and failure.kind == "protocol"
    assert "chunked" in failure.message and "--client httpx" in failure.message


def test_silence_is_a_timeout_and_a_closed_port_a_connect_failure() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    (failure,) = asyncio.run(_with_server(silent, 1, timeout_s=0.2))
    assert isinstance(failure, TransportFailure) and failure.kind == "timeout"

    async def refused() -> TransportFailure:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens on `port` now
        driver = LeanDriver(f"http://127.0.0.1:{port}", PAYLOADS, connections=1, timeout_s=1.0)
        with pytest.raises(TransportFailure) as caught:
            await driver.send(0)
        return caught.value

    assert asyncio.run(refused()).kind == "connect"


def test_a_server_that_hangs_up_mid_answer_is_a_protocol_failure() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(OK_HEAD.replace(b"length: 2", b"length: 100") + b"{}")  # 2 of 100 bytes
        writer.close()

    out = asyncio.run(_with_server(hang_up, 2))
    assert [f.kind for f in out] == ["protocol", "protocol"]  # and the second got a fresh connection


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_reused_connection_the_server_ended_is_sent_again_on_a_fresh_one(how: str) -> None:
    """The keep-alive race: the server closes an idle connection as a request is written to it.
    Here each connection answers once and then ends (FIN, or RST) on the next request unread; the
    driver counts any idle time as long enough (stale_idle_s=0)."""
    accepted = []

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await _read_request(reader)
        writer.write(OK_HEAD + b"{}")
        await reader.readuntil(b"\r\n\r\n")  # the next request's head arrived: end the connection unanswered
        if how == "reset":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    out, retries = asyncio.run(three_requests(answer_once, stale_idle_s=0.0))
    assert out == [(200, b"{}")] * 3
    assert retries == 2 and len(accepted) == 3  # requests 2 and 3 each met a stale connection once


async def three_requests(handler: Handler, *, stale_idle_s: float) -> tuple[list, int]:
    """Three requests one after another on one connection at a time: (answers or failures, retries)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    driver = LeanDriver(f"http://127.0.0.1:{port}", PAYLOADS, connections=1, timeout_s=5.0, stale_idle_s=stale_idle_s)
    out: list = []
    try:
        for i in range(3):
            try:
                out.append(await driver.send(i % 2))
            except TransportFailure as failure:
                out.append(failure)
        return out, driver.stale_retries
    finally:
        await driver.aclose()
        server.close()


def test_a_busy_connection_ended_before_its_answer_is_a_failure_not_a_retry() -> None:
    """Written at once after the last answer (no idle time): no keep-alive timeout can explain the
    end, so it is the server's failure and counts, as on a fresh connection."""

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(OK_HEAD + b"{}")
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    out, retries = asyncio.run(three_requests(answer_once, stale_idle_s=1.0))
    assert out[0] == (200, b"{}") and isinstance(out[1], TransportFailure) and out[2] == (200, b"{}")
    assert retries == 0


def test_a_fresh_connection_ended_before_any_answer_is_a_failure_not_a_retry() -> None:
    async def hang_up_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    out = asyncio.run(_with_server(hang_up_at_once, 2))
    assert [f.kind for f in out] == ["protocol", "protocol"]
