"""The default driver: a bare HTTP/1.1 keep-alive client on an asyncio Protocol (uvloop where the
worker runs it), so that the generator, not the server, is never the bottleneck.

Each request's bytes (request line, headers and body) are built once, before the run; a send is
one `transport.write` and a future that `data_received` resolves when the answer's
Content-Length bytes are in. One request at a time per connection (no pipelining). Only what a
load generator needs is parsed: the status line, Content-Length, Transfer-Encoding and
Connection. An answer it cannot frame (chunked, no Content-Length, 1xx, a malformed head) is a
`protocol` failure that says so and names `--client httpx`, the full client, as the way out.

A server closes a keep-alive connection that idled past its timeout (uvicorn: 5 s, nginx: 75 s).
A request written just as it does meets the close in flight: the connection ends (reset, or
closed) before a byte of the answer. Every HTTP/1.1 client meets this race; charged to the
server, it would be the client's reuse of a connection the server had let go. So a request
written on a connection that had idled at least STALE_IDLE_S since its last answer, and that
ended before any byte of its answer, is sent once more on a fresh connection, counted
(`stale_retries`: the record's counts.retried_stale_connection) and timed from its first send.
Any other failure counts, on a busy connection or a fresh one: a server that crashes, or cuts
connections under load, is not hidden.
"""

from __future__ import annotations

import asyncio
from typing import cast
from urllib.parse import urlsplit

from loadtest.connections import LifoPool, TransportFailure
from loadtest.payloads import Payloads

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; an answer's head larger than this is refused
STALE = "stale"  # the failure kind sent again on a fresh connection, never recorded as such
STALE_IDLE_S = 1.0  # idle this long before a write, a connection may have met a keep-alive timeout
NO_BODY_STATUSES = frozenset({204, 304})


class ResponseHeadError(ValueError):
    """An answer whose head the lean client cannot frame."""


def request_bytes(
    method: str, host: str, port: int, path: str, content_type: str, body: bytes,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:  # fmt: skip
    """One whole HTTP/1.1 request as it goes on the wire (`headers`: more besides the ones every request has)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 literal in brackets
    more = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\n{more}"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, body length, keep-alive) of an answer's head (up to, not including, the blank line).

    A few C-level searches of the lower-cased head rather than a loop over its lines: this runs
    once per request. Raises ResponseHeadError for what this client does not handle."""
    if not (head.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) and head[9:12].isdigit()):
        status_line = head.split(b"\r\n", 1)[0]
        raise ResponseHeadError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    status = int(head[9:12])
    if status < 200:
        raise ResponseHeadError(f"an interim {status} answer (the lean client sends no Expect)")
    lower = head.lower()
    if b"\r\ntransfer-encoding:" in lower:
        raise ResponseHeadError(
            f"Transfer-Encoding {(_header(lower, b'transfer-encoding') or b'')[:40]!r} (chunked) is not supported"
        )
    length_text = _header(lower, b"content-length")
    if length_text is None:
        if status not in NO_BODY_STATUSES:
            raise ResponseHeadError(f"a {status} answer without Content-Length")
        length = 0
    elif length_text.isdigit():
        length = int(length_text)
    else:
        raise ResponseHeadError(f"Content-Length {length_text[:40]!r} is not a number")
    keep_alive = head[5:8] == b"1.1"  # HTTP/1.1 keeps the connection unless told otherwise, 1.0 closes it
    connection = _header(lower, b"connection")
    if connection is not None:
        keep_alive = connection == b"keep-alive" or (keep_alive and connection != b"close")
    return status, length, keep_alive


def _header(lower_head: bytes, name: bytes) -> bytes | None:
    """The stripped value of the first header `name` (lower case) in a lower-cased head, or None."""
    start = lower_head.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    end = lower_head.find(b"\r\n", start)
    return lower_head[start : end if end >= 0 else len(lower_head)].strip()


class LeanConnection(asyncio.Protocol):
    """One keep-alive connection: `exchange` writes a request and waits for its whole answer."""

    def __init__(self, stale_idle_s: float = STALE_IDLE_S) -> None:
        self.stale_idle_s = stale_idle_s
        self.transport: asyncio.WriteTransport | None = None
        self.loop: asyncio.AbstractEventLoop  # set with the transport, in connection_made
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False
        self.keep_alive = True
        self.head: tuple[int, int, int] | None = None  # (status, body start, body length) once parsed
        self.answered_at: float | None = None  # loop time of the last whole answer; None: never reused
        self.idle_s = 0.0  # how long the connection had idled when the request now waiting was written

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is no subclass of asyncio's classes, only of their interface.
        self.transport = cast(asyncio.WriteTransport, transport)  # both loops set TCP_NODELAY
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            self._fail(TransportFailure("protocol", f"{len(self.buffer)} bytes arrived with no request waiting"))
            return
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    self._fail(TransportFailure("protocol", f"an answer's head over {MAX_HEAD_BYTES} bytes"))
                return
            try:
                status, length, self.keep_alive = parse_head(bytes(self.buffer[:end]))
            except ResponseHeadError as error:
                self._fail(TransportFailure("protocol", f"{error}; the lean client refuses it, use --client httpx"))
                return
            self.head = (status, end + 4, length)
        status, start, length = self.head
        if len(self.buffer) < start + length:
            return
        if len(self.buffer) > start + length:
            self._fail(TransportFailure("protocol", f"{len(self.buffer) - start - length} bytes past the answer"))
            return
        body = bytes(self.buffer[start:])
        self.buffer.clear()
        self.head = None
        self.answered_at = self.loop.time()
        self.waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.answered_at is not None and self.idle_s >= self.stale_idle_s and not self.buffer:  # idle
                how = "closed" if exc is None else f"{type(exc).__name__}: {exc}"
                failure = TransportFailure(STALE, f"a reused connection ended before any answer ({how})")
            elif exc is None:
                failure = TransportFailure("protocol", "the server closed the connection without a whole answer")
            else:
                failure = TransportFailure("network", f"{type(exc).__name__}: {exc}")
            self.waiter.set_exception(failure)

    def _fail(self, failure: TransportFailure) -> None:
        """The connection's state is unknown after this: answer the waiter and close."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(failure)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _time_out(self, timeout_s: float) -> None:
        self._fail(TransportFailure("timeout", f"no whole answer within {timeout_s:g} s"))

    async def exchange(self, request: bytes, timeout_s: float) -> tuple[int, bytes]:
        assert self.transport is not None
        loop = self.loop
        waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self.waiter = waiter
        self.idle_s = 0.0 if self.answered_at is None else loop.time() - self.answered_at
        self.transport.write(request)
        timer = loop.call_later(timeout_s, self._time_out, timeout_s)  # one TimerHandle: cheaper than asyncio.timeout
        try:
            return await waiter
        finally:
            timer.cancel()
            self.waiter = None
            if waiter.cancelled():  # cancelled mid-answer: the rest of it would confuse the next request
                self._fail(TransportFailure("unfinished", "cancelled"))


class LeanDriver:
    """POSTs the payloads' bodies to `base_url` over at most `connections` keep-alive connections."""

    def __init__(self, base_url: str, payloads: Payloads, *, connections: int, timeout_s: float,
                 stale_idle_s: float = STALE_IDLE_S) -> None:  # fmt: skip
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the lean client speaks plain http:// only, got {base_url!r}")
        self.host, self.port, self.timeout_s = parts.hostname, parts.port or 80, timeout_s
        ctype = payloads.content_type
        self.stale_idle_s = stale_idle_s
        path, more = payloads.path, payloads.headers
        self.requests = [request_bytes("POST", self.host, self.port, path, ctype, b, more) for b in payloads.bodies]
        self.pool: LifoPool[LeanConnection] = LifoPool(connections, self._open, timeout_s)
        self.stale_retries = 0

    @property
    def connection_waits(self) -> int:
        return self.pool.waits

    async def _open(self) -> LeanConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                _, conn = await loop.create_connection(lambda: LeanConnection(self.stale_idle_s), self.host, self.port)
        except TimeoutError:
            message = f"connect to {self.host}:{self.port}: no answer in {self.timeout_s:g} s"
            raise TransportFailure("timeout", message) from None
        except OSError as error:
            raise TransportFailure("connect", f"{type(error).__name__}: {error}") from None
        return conn

    async def send(self, j: int) -> tuple[int, bytes]:
        try:
            return await self._send_once(j)
        except TransportFailure as failure:
            if failure.kind != STALE:
                raise
        self.stale_retries += 1
        return await self._send_once(j)  # on a fresh connection (the stale one's free slot is on top)

    async def _send_once(self, j: int) -> tuple[int, bytes]:
        conn = await self.pool.take()
        if conn.closed:  # the server closed it while idle (its keep-alive timeout): open another
            self.pool.give_back(None)  # on top of the LIFO queue: the next take opens a fresh one
            conn = await self.pool.take()
        reusable = False
        try:
            answer = await conn.exchange(self.requests[j], self.timeout_s)
            reusable = conn.keep_alive and not conn.closed
            return answer
        finally:
            if not reusable and not conn.closed:
                conn.closed = True
                assert conn.transport is not None
                conn.transport.close()
            self.pool.give_back(conn if reusable else None)

    async def aclose(self) -> None:
        for conn in self.pool.opened:
            if not conn.closed and conn.transport is not None:
                conn.transport.close()
