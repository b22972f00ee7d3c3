"""Bodies that come too slowly, and the rest of a body after an early answer, in the guarded
protocol (app/http/protocol.py) with the request guard (app/http/limits.py) in front of a reading
app (issue 24.2).

Raw bytes into the protocol in-process, on the recording transport of test_inline_protocol.py;
a timer's expiry is its callback called, as test_inline_protocol.py calls _body_timeout.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.config import Settings
from app.errors import ServiceError, error_body
from app.http.limits import BodyBudget, RequestGuard
from app.http.protocol import LINGER_BYTES, GuardedHttpProtocol
from tests.unit.test_inline_protocol import StubInline, Transport, connected, settle

DEFAULTS = Settings()


async def reading_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the body and answers 200, or the error a receive() raised, as the routes answer it."""
    try:
        while (await receive()).get("more_body"):
            pass
        status, headers, body = 200, [], b"read"
    except ServiceError as error:
        status, body = error.status, error_body(error)
        headers = [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refusing_app(scope: Any, receive: Any, send: Any) -> None:
    """Answers 413 at once, without a byte of the body and without `connection: close` (as a
    route answers a chunked body once it crosses the limit)."""
    await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"3")]})
    await send({"type": "http.response.body", "body": b"big"})


GUARDED = RequestGuard(
    reading_app, max_body_bytes=DEFAULTS.max_body_bytes, budget=BodyBudget(DEFAULTS.max_inflight_bytes),
    request_timeout_s=60.0, body_timeout_s=DEFAULTS.body_timeout_s,
)  # fmt: skip


def head(path: str, length: int) -> bytes:
    media = "content-type: application/octet-stream"
    return f"POST {path} HTTP/1.1\r\nhost: x\r\n{media}\r\ncontent-length: {length}\r\n\r\n".encode()


@pytest.fixture(autouse=True)
def no_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GuardedHttpProtocol, "inline", None)


def status(transport: Transport) -> int:
    return int(bytes(transport.written).split(b" ", 2)[1])


@pytest.mark.anyio
async def test_a_body_below_the_minimum_rate_gets_408_and_its_connection_is_closed() -> None:
    protocol, transport = await connected(GUARDED)
    protocol.data_received(head("/predict", 16 * 2**20) + b"x" * 100)
    await settle()
    protocol.data_received(b"x")  # a byte now and then: never a pause long enough for the timeout
    await settle()
    assert protocol._rate_timer is not None  # armed while the body comes in pieces
    protocol._rate_check()  # the window is over: 101 bytes in it, far below the minimum
    await settle()
    assert status(transport) == 408 and transport.closed
    assert b"bytes/s" in transport.written and b"CGSERVE_BODY_MIN_RATE_BYTES_S" in transport.written


@pytest.mark.anyio
async def test_a_body_that_keeps_up_is_read_whole() -> None:
    protocol, transport = await connected(GUARDED)
    rate = GuardedHttpProtocol.body_min_rate_bytes_s * GuardedHttpProtocol.body_rate_window_s
    size = int(rate) * 3
    protocol.data_received(head("/predict", size) + b"x" * 100)
    sent = 100
    for _ in range(2):
        await settle()
        protocol.data_received(b"x" * int(rate))
        sent += int(rate)
        protocol._rate_check()  # each window held the minimum
    await settle()
    protocol.data_received(b"x" * (size - sent))
    await settle()
    assert status(transport) == 200 and not transport.closed


@pytest.mark.anyio
async def test_a_slow_body_is_failed_inline_too(monkeypatch: pytest.MonkeyPatch) -> None:
    inline = StubInline()
    monkeypatch.setattr(GuardedHttpProtocol, "inline", inline)
    protocol, transport = await connected()
    protocol.data_received(head("/predict", 1000) + b"x")
    protocol._rate_check()
    assert len(inline.failed) == 1 and "bytes/s" in str(inline.failed[0]) and transport.closed


@pytest.mark.anyio
async def test_after_an_early_413_the_rest_of_a_large_body_is_not_read_for_long() -> None:
    protocol, transport = await connected(refusing_app)
    protocol.data_received(head("/predict", 16 * 2**20) + b"x" * 1000)
    await settle()
    assert status(transport) == 413 and not transport.closed  # the answer is out; some of the rest is read
    # ... and says the connection closes: a keep-alive client sent its next request into a connection closed under
    # it, and lost it (a review)
    assert b"connection: close" in bytes(transport.written).lower()
    for _ in range(LINGER_BYTES // 16384 + 1):
        protocol.data_received(b"x" * 16384)
    assert transport.closed


@pytest.mark.anyio
async def test_an_early_answer_to_a_chunked_body_says_close_and_closes_once_the_rest_is_read() -> None:
    protocol, transport = await connected(refusing_app)
    chunked = b"POST /predict HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
    protocol.data_received(chunked + b"10\r\n" + b"x" * 16 + b"\r\n")
    await settle()
    assert status(transport) == 413 and b"connection: close" in bytes(transport.written).lower()
    assert not transport.closed  # the rest is read first: closed unread, the client's kernel may lose the answer
    protocol.data_received(b"0\r\n\r\n")  # the rest, whole and small: still closed, as the answer said
    assert transport.closed


@pytest.mark.anyio
async def test_after_an_early_413_a_trickling_rest_is_cut_off_in_time() -> None:
    protocol, transport = await connected(refusing_app)
    protocol.data_received(head("/predict", 16 * 2**20) + b"x" * 1000)
    await settle()
    protocol.data_received(b"x")
    protocol._linger_over()  # what the armed timer calls after LINGER_S
    assert status(transport) == 413 and transport.closed


@pytest.mark.anyio
async def test_after_an_early_answer_a_small_rest_keeps_the_connection() -> None:
    protocol, transport = await connected(refusing_app)
    protocol.data_received(head("/predict", 2000) + b"x" * 1000)
    await settle()
    protocol.data_received(b"x" * 1000)  # the rest, whole: the connection serves the next request
    protocol.data_received(head("/predict", 0))
    await settle()
    assert bytes(transport.written).count(b"HTTP/1.1 413") == 2 and not transport.closed
    assert b"connection: close" not in bytes(transport.written).lower()  # a rest the linger takes whole
