"""The guarded HTTP protocol's hooks for requests answered inline (app/http/protocol.py): which
requests it hands over, that they never reach the ASGI app, and that keep-alive, pipelining,
HTTP/1.0, a lost connection and a paused body still behave as uvicorn's own path does.

The protocol runs in-process on a transport that records what is written; the inline handler is
a stand-in that answers each body reversed when the test says so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from app.http.heads import Head
from app.http.inline import InlineRequest
from app.http.inline_routes import PREDICT
from app.http.limits import FIRST_BYTE_KEY
from app.http.protocol import GuardedHttpProtocol, write_answer


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class StubInline:
    """Takes POST /predict; answers each body reversed when `answer_all` is called."""

    def __init__(self) -> None:
        self.pending: list[InlineRequest] = []
        self.abandoned: list[InlineRequest] = []
        self.failed: list[Exception] = []

    def take(self, cycle: Any) -> InlineRequest | None:
        if cycle.scope["method"] != "POST" or cycle.scope["path"] != "/predict":
            return None
        deadline = cycle.scope["extensions"][FIRST_BYTE_KEY] + 10
        return InlineRequest(cycle, PREDICT, "raw", Head(length=0), deadline, 0.0)  # type: ignore[arg-type]

    def body_complete(self, request: InlineRequest) -> None:
        self.pending.append(request)

    def answer_all(self) -> None:
        while self.pending:
            request = self.pending.pop(0)
            request.answered = True
            body = bytes(request.cycle.body)[::-1]
            write_answer(request.cycle, 200, [(b"content-length", b"%d" % len(body))], body)

    def fail(self, request: InlineRequest, error: Exception) -> None:
        request.answered = True
        self.failed.append(error)
        write_answer(request.cycle, 408, [(b"content-length", b"4"), (b"connection", b"close")], b"late")

    def abandon(self, request: InlineRequest) -> None:
        request.answered = True
        self.abandoned.append(request)


asgi_calls: list[str] = []


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    """What uvicorn's own path runs: answers "asgi <path>"."""
    asgi_calls.append(scope["path"])
    while (await receive()).get("more_body"):
        pass
    body = f"asgi {scope['path']}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def request(path: str, body: bytes, *, version: str = "1.1") -> bytes:
    head = f"POST {path} HTTP/{version}\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.fixture
def inline(monkeypatch: pytest.MonkeyPatch) -> StubInline:
    stub = StubInline()
    monkeypatch.setattr(GuardedHttpProtocol, "inline", stub)
    asgi_calls.clear()
    return stub


async def connected(app: Any = asgi_app) -> tuple[GuardedHttpProtocol, Transport]:
    config = Config(app=app, http=GuardedHttpProtocol, log_level="warning")
    config.load()
    protocol = GuardedHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def answers(written: bytes) -> list[bytes]:
    """The bodies of the answers written, in order (each answer has a content-length)."""
    bodies = []
    for part in written.split(b"HTTP/1.1 ")[1:]:
        head, _, rest = part.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        bodies.append(rest[:length])
    return bodies


@pytest.mark.anyio
async def test_taken_requests_never_reach_asgi_and_the_connection_stays_open(inline: StubInline) -> None:
    protocol, transport = await connected()
    for body in (b"abc", b"xyz"):
        protocol.data_received(request("/predict", body))
        assert len(inline.pending) == 1  # whole: handed over at once, nothing written yet
        inline.answer_all()
    await settle()
    assert answers(transport.written) == [b"cba", b"zyx"]
    assert not asgi_calls and not transport.closed


@pytest.mark.anyio
async def test_other_routes_go_the_asgi_way(inline: StubInline) -> None:
    protocol, transport = await connected()
    protocol.data_received(request("/v2/models/m/infer", b"{}"))
    await settle()
    assert asgi_calls == ["/v2/models/m/infer"] and not inline.pending
    assert answers(transport.written) == [b"asgi /v2/models/m/infer"]


@pytest.mark.anyio
async def test_a_body_in_pieces_is_handed_over_once_whole(inline: StubInline) -> None:
    protocol, transport = await connected()
    whole = request("/predict", b"0123456789")
    protocol.data_received(whole[:-4])
    assert not inline.pending
    protocol.data_received(whole[-4:])
    inline.answer_all()
    assert answers(transport.written) == [b"9876543210"]


@pytest.mark.anyio
async def test_pipelined_requests_are_answered_in_order(inline: StubInline) -> None:
    protocol, transport = await connected()
    # One write: an inline request, then two more queued behind it (uvicorn's pipeline: the ASGI way).
    protocol.data_received(request("/predict", b"ab") + request("/other", b"") + request("/predict", b"cd"))
    await settle()
    assert not transport.written  # the first is unanswered: nothing behind it may be answered first
    inline.answer_all()
    await settle()
    assert answers(transport.written) == [b"ba", b"asgi /other", b"asgi /predict"]


@pytest.mark.anyio
async def test_http_1_0_is_answered_with_connection_close(inline: StubInline) -> None:
    protocol, transport = await connected()
    protocol.data_received(request("/predict", b"ab", version="1.0"))
    inline.answer_all()
    assert b"connection: close\r\n" in transport.written and transport.closed


@pytest.mark.anyio
async def test_a_lost_connection_abandons_its_request(inline: StubInline) -> None:
    protocol, _ = await connected()
    protocol.data_received(request("/predict", b"ab"))
    taken = inline.pending[0]
    protocol.connection_lost(None)
    assert inline.abandoned == [taken]


@pytest.mark.anyio
async def test_a_paused_body_is_failed_inline(inline: StubInline) -> None:
    protocol, transport = await connected()
    whole = request("/predict", b"0123456789")
    protocol.data_received(whole[:-4])
    protocol._body_timeout()  # what the armed timer calls after CGSERVE_BODY_TIMEOUT_S
    assert len(inline.failed) == 1 and transport.written.startswith(b"HTTP/1.1 408 ") and transport.closed
    assert not asgi_calls


@pytest.mark.anyio
async def test_a_connection_answered_before_its_body_came_keeps_an_idle_timer(inline: StubInline) -> None:
    """uvicorn arms its keep-alive timer when an answer is written and cancels it on each byte
    that arrives: answered early (a refusal, a 504), the rest of the body left no timer at all."""
    protocol, transport = await connected()
    whole = request("/predict", b"0123456789")
    protocol.data_received(whole[:-4])
    assert protocol._inline is not None
    taken = protocol._inline[1]
    taken.answered = True
    write_answer(taken.cycle, 504, [(b"content-length", b"4")], b"late")  # as the deadline's answer is written
    protocol.data_received(whole[-4:])  # the rest of the body: read, dropped
    assert protocol.timeout_keep_alive_task is not None and not transport.closed
    assert answers(transport.written) == [b"late"] and not inline.pending
    protocol.data_received(request("/predict", b"ab"))  # the connection serves the next request
    assert protocol.timeout_keep_alive_task is None  # cancelled by its bytes, as uvicorn does
    inline.answer_all()
    assert answers(transport.written) == [b"late", b"ba"]


class ResetTransport(Transport):
    """uvloop's transport after ECONNRESET: closed, and a write raises, before connection_lost is called."""

    def write(self, data: bytes) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
        super().write(data)


@pytest.mark.anyio
async def test_an_answer_sent_after_a_reset_is_not_logged_as_the_apps_error(
    inline: StubInline, caplog: pytest.LogCaptureFixture
) -> None:
    """The transport closed by a reset, connection_lost not yet called: the app's send meets the closed
    transport. That is the client leaving: no "Exception in ASGI application", no 500 written after it."""
    answered = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answered.wait()  # the answer comes after the reset
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = Config(app=app, http=GuardedHttpProtocol, log_level="warning")
    config.load()
    protocol = GuardedHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = ResetTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request("/other", b"ab"))
    await settle()
    transport.close()  # ECONNRESET: uvloop closes the transport; connection_lost comes a turn later
    answered.set()
    await settle()
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
    assert protocol.cycle is not None and protocol.cycle.disconnected
    protocol.connection_lost(ConnectionResetError())


@pytest.mark.anyio
async def test_a_partial_head_pipelined_behind_a_whole_request_has_its_timer_from_its_first_byte(
    inline: StubInline,
) -> None:
    """Its timer was armed only when its next byte came: a client that sent no more waited for the
    keep-alive timer instead, and a 408 came late by however long the next byte took (a review)."""
    protocol, transport = await connected()
    protocol.data_received(request("/other", b"ab") + b"GET /healthz HTTP/1.1\r\nho")
    await settle()
    assert answers(bytes(transport.written)) == [b"asgi /other"]
    assert protocol._timer is not None  # the partial head's, armed in the read it began in
    protocol._header_timeout()  # its time is up
    assert b"HTTP/1.1 408" in transport.written and transport.closed
