"""uvicorn's httptools protocol with the limits an exposed server needs and uvicorn lacks.

- Connections: over CGSERVE_MAX_CONNECTIONS per process, a new connection gets 503 (with
  Retry-After) and is closed before anything of it is parsed.
- Headers: a request line and headers over CGSERVE_MAX_HEADER_BYTES get 431 and the connection
  is closed (httptools itself would buffer any size), however the bytes arrive: counted as they
  come while a head is incomplete, and as the parser hands over its parts when a whole head
  comes in one write. Headers not complete within
  CGSERVE_HEADER_TIMEOUT_S of the request's first byte, or of the connection's opening, get 408
  (slowloris: one byte every few seconds holds nothing for long).
- A transfer coding other than chunked alone (gzip, "gzip, chunked") gets 501 and the connection is closed (RFC 9112
  §6.1; chunked twice is httptools' own 400): httptools framed "gzip, chunked" as chunked and dropped the gzip,
  where a proxy in front that decodes it reads another body (request smuggling).
- Heads that would be read two ways get 400 and the connection is closed, as nginx answers them:
  HTTP/1.1 without Host or with two (HTTP/1.0 with two), two Authorization headers (which one
  would the tokens check?), a path with a control character once percent-decoded (%0A: no route
  has one, and a newline has fooled path patterns before, issue 24.1), and a request asking to
  upgrade the connection (Connection: upgrade, CONNECT) that carries a body: httptools stops at
  such a head, so its body was never read as one and came in as the next request (smuggled past
  a proxy that counted one). One without a body is answered, then the connection is closed:
  httptools skipped whatever came after its head in that read.
- A request httptools cannot parse (a raw control character, a Content-Length that is not digits, bare LF line
  endings) gets 400 in the service's error shape, and the connection is closed.
- A client that half-closes (shutdown(SHUT_WR), `nc -N`) after its request still gets the answer:
  the connection closes once the last answer owed is written, not at the end of the client's bytes
  (plain TCP only: asyncio's TLS transport closes at the client's close_notify whatever we say).
- Pipelining: at most MAX_PIPELINED requests awaiting answers on a connection; the next gets 429.
  A refusal of a pipelined request (429, a head above, bytes that are not HTTP, a queued request's
  broken chunk framing) is written after the answers owed before it, then the connection closes,
  as nginx does; nothing more is read meanwhile. With none owed it is written at once.
- Bodies: a body that pauses longer than CGSERVE_BODY_TIMEOUT_S between two chunks is marked in
  its scope (extensions["cgserve.body_timed_out"]) and the app's waiting receive() is woken;
  app/http/limits.py then answers 408. The timer is armed only while part of a body is still
  to come, so a request that arrives whole (nearly all of them) arms none. A body must also keep
  up CGSERVE_BODY_MIN_RATE_BYTES_S over each CGSERVE_BODY_RATE_WINDOW_S (a byte every few seconds
  never pauses long, and held a connection and its share of the bytes-in-flight budget for hours):
  one slower gets 408 the same way. A window in which the app had yet to take what came (our
  pause, not the client's) is not judged.
- An answer written before its body was whole (413, 408, 504, 401, a refusal): the rest of the
  body is read and dropped for at most LINGER_S and LINGER_BYTES, then the connection is closed
  (closed at once, with the rest unread, the client's kernel may reset it before the answer is
  read); a rest declared within LINGER_BYTES that comes whole in time leaves the connection open
  for the next request. Any other rest (larger, or chunked) cannot, and the answer says
  `Connection: close` (RFC 9112 §9.6): a keep-alive client sent its next request on a connection
  closed under it and lost it (a review).
- The deadline's start: the time of each request's first byte goes into the ASGI scope
  (extensions["cgserve.first_byte"]), so the end-to-end deadline counts the reading too.
- Small inference requests (POST /predict, the v2 infer; app/http/inline_routes.py): while the app
  serves, its ProtocolHooks' `inline` (app/http/inline.py) may take a request at the end of its headers; it is
  then answered from here, below the ASGI stack, when its body is whole. Only a request that
  starts as its headers end (not a pipelined one queued behind another).
This module is where the service reaches below uvicorn's public protocol API (app/runtime/workers.py does the
same for its process manager, checked likewise): the class
overrides parts of its HttpToolsProtocol (its parser callbacks, _start_asgi_task, send_400_response,
on_response_complete), and write_answer writes an inline answer on a request's cycle as uvicorn's
own send() would (app/http/inline.py reads only a cycle's scope and body). pyproject.toml pins the
uvicorn releases it was verified on, and check_server() refuses to start, in one line, where the
installed uvicorn lacks one of them (an override of a method that is gone is never called: under
uvicorn 0.35 every request silently took the slow path, issue 23.7).
Keep-alive idle timeouts are uvicorn's own (timeout_keep_alive), with one gap closed: uvicorn
arms the timer when an answer is written and cancels it on every byte that arrives, so a request
answered before its body was whole (a refusal, a 504) left the connection with no timer once the
rest of its body came. It is armed again then.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol
from urllib.parse import unquote_to_bytes

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from app.config import Settings
from app.errors import RequestTimeoutError, ServiceError, error_body, retry_after
from app.http.limits import BODY_TIMED_OUT_KEY, FIRST_BYTE_KEY, BodyTooSlowError
from app.ops import timers
from app.ops.connection_budgets import connection_budgets
from app.ops.log_limits import INVALID_REQUEST


class _ConnectionRefused(ServiceError):
    status = 503
    code = "overloaded"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the server holds {limit} connections already", expected="a retry after the Retry-After interval",
            headers=retry_after(0.1),
        )  # fmt: skip


class _HeaderProblem(ServiceError):
    def __init__(self, status: int, code: str, message: str, expected: str) -> None:
        super().__init__(message, expected=expected)
        self.status, self.code = status, code


class _Refused(Exception):
    """Raised in a parser callback: httptools stops parsing at once and uvicorn calls
    send_400_response, which answers the protocol's `_refused` instead of its own text."""


REASONS = {
    400: b"Bad Request",
    503: b"Service Unavailable",
    431: b"Request Header Fields Too Large",
    408: b"Request Timeout",
    429: b"Too Many Requests",
    501: b"Not Implemented",
}
# What a request httptools cannot parse is told (uvicorn's own answer was the text "Invalid HTTP request received.").
NOT_PARSEABLE_EXPECTED = (
    "well-formed HTTP/1.1 (RFC 9112): a request line 'METHOD /path HTTP/1.1' with no control character in the "
    "path, lines ending in CRLF, 'Name: value' headers without a space before the colon, one Content-Length of "
    "digits or chunked framing"
)
UVICORN_ERRORS = logging.getLogger("uvicorn.error")  # where uvicorn logs each request httptools cannot parse
CONTROL = re.compile(rb"[\x00-\x1f\x7f]")  # in a percent-decoded path (httptools refuses them raw)
LINGER_S = 1.0  # after an answer written before its body was whole: how long the rest may take
LINGER_BYTES = 65536  # ... and how much of it is read and dropped before the connection is closed
# Requests a connection may have awaiting their answers (HTTP/1.1 pipelining): uvicorn queues every head
# a read holds, each with its scope and cycle, and a client pipelining GET /healthz without reading its
# answers grew a server 265 → 1,453 MB in 15 s (bench/results/2026-12-03-cpu-pipelined-flood.md). Load tools
# pipeline 16 deep; past this, 429 and close.
MAX_PIPELINED = 32
REQUEST_LINE_BYTES = 16  # the method, the version, spaces and CRLF of a request line, about
# Headers whose every instance on_header notes: two Hosts or two Authorizations are refused (_check_head), and
# Expect: 100-continue is what uvicorn's cycle answers with a 100 before it reads the body.
WATCHED_HEADERS = frozenset((b"host", b"authorization", b"expect", b"transfer-encoding"))
CHUNKED = [b"chunked"]  # the one transfer coding taken (RFC 9112 §6.1: another is 501)


# Bodies up to this are taken inline, read whole into their cycle: one 3×256×256 uint8 image and
# more (ResNet-50's one image a request is 150 KB, issue 26). Past uvicorn's read high-water mark
# (HIGH_WATER_LIMIT, 64 KiB) on_body resumes the reading uvicorn pauses there for the ASGI receive().
# Not much larger: each is held whole in memory until it is decoded (its bytes reserved in the budget).
INLINE_BODY_LIMIT = 256 * 1024


class InlineRequest(Protocol):
    """A request an inline handler took: answered from its cycle (write_answer) once, then `answered`."""

    cycle: RequestResponseCycle
    answered: bool


class InlineHandler(Protocol):
    """What answers requests inside the protocol (app/http/inline.py's InlinePredict)."""

    def take(self, cycle: RequestResponseCycle) -> InlineRequest | None:
        """At the end of the headers: the request's state if it is answered here, else None (ASGI's)."""
        ...

    def body_complete(self, request: Any) -> None: ...

    def fail(self, request: Any, error: Exception) -> None: ...

    def abandon(self, request: Any) -> None: ...


HOOKS_KEY = "cgserve.http"  # the ASGI lifespan state's key for the app's ProtocolHooks


@dataclass(slots=True)
class ProtocolHooks:
    """What one app gives the HTTP protocol of the server that runs it: its limits, and while it serves
    the handler of inline requests. Built by create_app, yielded in its lifespan's state (ASGI's own
    way for an app to hand the server per-app objects); uvicorn gives each connection that state."""

    max_connections: int
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    body_min_rate_bytes_s: int
    body_rate_window_s: float
    inline: InlineHandler | None = None  # set by the app's lifespan while it serves (app/main.py)

    @classmethod
    def from_settings(cls, settings: Settings) -> ProtocolHooks:
        return cls(
            max_connections=connection_budgets(settings).http,
            max_header_bytes=settings.max_header_bytes,
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            body_min_rate_bytes_s=settings.body_min_rate_bytes_s,
            body_rate_window_s=settings.body_rate_window_s,
        )


class GuardedHttpProtocol(HttpToolsProtocol):
    # Defaults for an app that yields no ProtocolHooks (a benchmark's reference server, a test's stub);
    # the service's own come from its settings, per app, through the lifespan state.
    max_connections = 1024
    max_header_bytes = 65536
    header_timeout_s = 10.0
    body_timeout_s = 10.0
    body_min_rate_bytes_s = 16384
    body_rate_window_s = 5.0
    inline: InlineHandler | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        UVICORN_ERRORS.addFilter(INVALID_REQUEST)  # once a process: a filter already added is not added again
        super().__init__(*args, **kwargs)
        hooks: ProtocolHooks | None = (kwargs.get("app_state") or {}).get(HOOKS_KEY)
        self._hooks = hooks
        if hooks is not None:
            self.max_connections, self.max_header_bytes = hooks.max_connections, hooks.max_header_bytes
            self.header_timeout_s, self.body_timeout_s = hooks.header_timeout_s, hooks.body_timeout_s
            self.body_min_rate_bytes_s, self.body_rate_window_s = hooks.body_min_rate_bytes_s, hooks.body_rate_window_s
        self._in_headers = True  # between requests or inside a request's head
        self._header_bytes = 0  # raw bytes of a head that came in pieces
        self._head_bytes = 0  # the head as the parser hands it over (URL, names, values)
        self._hosts = self._authorizations = 0
        self._transfer_codings: list[bytes] = []  # each Transfer-Encoding header's value, as sent
        self._refused: ServiceError | None = None
        self._first_byte: float | None = None
        self._starting = False  # inside on_headers_complete: the request may be taken inline
        # The request taken inline last on this connection, and who took it (kept: the class's
        # `inline` is cleared at shutdown while a request may still be on its way).
        self._inline: tuple[InlineHandler, InlineRequest] | None = None
        # One timer a connection: the header timeout while a head is read, the body's pause
        # timeout while part of a body is still to come (never both at once).
        self._timer: timers.Armed | None = None
        # While a body comes in pieces: its bytes in the current rate window, and that window's timer.
        self._window_bytes = 0
        self._rate_timer: timers.Armed | None = None
        self._lingering: int | None = None  # bytes dropped since an answer written before its body was whole
        self._body_bytes = 0  # of the body being read, so far: an early answer's rest is its length less these
        self._close_after_linger = False  # an early answer said Connection: close: no request follows the rest
        self._last_words: bytes | None = None  # a refusal that waits for the answers owed before it
        self._last_whole: RequestResponseCycle | None = None  # the newest request that came whole
        self._head_begun_mid_read = False  # on_message_begin's word to data_received

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._answer_and_close(_ConnectionRefused(self.max_connections))
            return
        self._arm(self.header_timeout_s, self._header_timeout)  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_rate()
        if self._inline is not None:
            handler, request = self._inline
            handler.abandon(request)  # nothing, if it was answered
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._last_words is not None:  # refused already, its answer waiting on an earlier one's: dropped
            return
        first = self._in_headers and self._first_byte is None
        if first:
            self._first_byte = time.monotonic()
        super().data_received(data)
        if self._last_words is not None:  # this read's head was refused: no timer for it
            return
        if self._head_begun_mid_read:  # rare: pipelining, or a read that began inside a body
            self._head_begun_mid_read = False
            if self._in_headers and self._first_byte is not None and not self.transport.is_closing():
                # Behind a whole request, and not whole itself: its timer runs from its first byte (it waited
                # for the next read before). Its bytes so far are counted by the parser's callbacks.
                self._arm(self.header_timeout_s, self._header_timeout)
                return
        if first and self._in_headers and self._first_byte is not None and not self.transport.is_closing():
            # The head's timeout, armed only where the head did not come whole in its first read (most do:
            # no timer to arm and cancel for them); it runs from the first byte, a parse's µs ago.
            self._arm(self.header_timeout_s, self._header_timeout)
        if self._in_headers and self._first_byte is not None:  # all of `data` belonged to the head
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
                self._answer_and_close(self._too_large())
        elif not self._in_headers and not self.transport.is_closing():  # part of a body is still to come
            if self._lingering is not None:  # answered already: the rest is dropped, up to a point
                self._lingering += len(data)
                if self._lingering > LINGER_BYTES:
                    self.transport.close()
                return
            self._arm(self.body_timeout_s, self._body_timeout)  # or re-arm: it bounds each pause, not the body
            self._window_bytes += len(data)
            if self._rate_timer is None:
                self._rate_timer = timers.call_at(time.monotonic() + self.body_rate_window_s, self._rate_check)
        elif self._in_headers and self._first_byte is None and self.cycle is not None and self.cycle.response_complete:
            self._keep_idle_timer()  # between requests, nothing of the next yet, and nothing owed

    def _keep_idle_timer(self) -> None:
        """After the last of a body whose answer was written before it came: uvicorn's keep-alive
        timer, which every arriving byte cancelled (an answer still owed arms it when written)."""
        if self.timeout_keep_alive_task is None and not self.pipeline and not self.transport.is_closing():
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = REQUEST_LINE_BYTES
        self._hosts = self._authorizations = 0
        self._transfer_codings = []
        if self._first_byte is None:  # a head that begins after a whole request in the same read
            self._first_byte = time.monotonic()
            self._head_begun_mid_read = True

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_bytes += len(url)
        if self._head_bytes > self.max_header_bytes:
            self._refuse(self._too_large())

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's own (a lowercased name into the scope's headers; Expect: 100-continue noted) and ours in one
        # call: this runs for every header of every request, the costliest of the parser's callbacks.
        name = name.lower()
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._head_bytes > self.max_header_bytes:
            self._refuse(self._too_large())
        if name in WATCHED_HEADERS:
            self._watch(name, value)
        self.headers.append((name, value))

    def _watch(self, name: bytes, value: bytes) -> None:
        if name == b"host":
            self._hosts += 1
        elif name == b"authorization":
            self._authorizations += 1
        elif name == b"transfer-encoding":
            self._transfer_codings.append(value)
        elif value.lower() == b"100-continue":  # Expect
            self.expect_100_continue = True

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        cycle = self.cycle
        if self._inline is not None and self._inline[1].cycle is cycle:
            # An inline request has no receive() to wake nor to pause reading for (uvicorn's own does both, at
            # its read high-water mark): its body, at most INLINE_BODY_LIMIT, is read whole into its cycle.
            if not cycle.response_complete:  # else answered early: the rest is dropped (data_received)
                cycle.body += body
            return
        super().on_body(body)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request httptools could not parse, or one a callback refused."""
        if self._refused is not None:
            if not self.transport.is_closing():
                self._answer_and_close(self._refused)
            return
        if not self._in_headers:
            self._forget_broken_queued()
        pipelined = self._answer_owed()  # garbage behind a good request: that one is answered first
        self._answer_and_close(
            _HeaderProblem(
                400, "bad_request",
                f"{'a request pipelined on this connection' if pipelined else 'the request'} is not well-formed "
                "HTTP/1.1: httptools could not parse its request line, a header or its body framing",
                NOT_PARSEABLE_EXPECTED,
            )
        )  # fmt: skip

    def _forget_broken_queued(self) -> None:
        """A pipelined request queued behind another whose body broke its framing (a bad chunk size): it is
        dropped, so that the answers owed before it are written, then the refusal (send_400_response)."""
        if self.pipeline and self.pipeline[0][0] is self.cycle and self._last_whole is not None:
            self.pipeline.popleft()  # its task never started: nothing else holds it
            self.cycle, self._in_headers = self._last_whole, True
            self._disarm()
            self._stop_rate()

    def _check_head(self, upgrade: bool) -> None:
        """Refuse a head that servers and proxies could read two ways."""
        version = self.parser.get_http_version()
        if self._hosts > 1 or (self._hosts == 0 and version == "1.1"):
            self._refuse(
                _HeaderProblem(
                    400, "bad_request", f"HTTP/{version} request with {self._hosts} Host headers",
                    "exactly one Host header (HTTP/1.1), at most one (HTTP/1.0)",
                )
            )  # fmt: skip
        if self._authorizations > 1:
            self._refuse(
                _HeaderProblem(
                    400, "bad_request", f"{self._authorizations} Authorization headers",
                    "at most one Authorization header",
                )
            )  # fmt: skip
        if self._transfer_codings:
            codings = [coding.strip() for coding in b",".join(self._transfer_codings).lower().split(b",")]
            if codings != CHUNKED:  # httptools would frame it as chunked and drop the rest: a proxy might not
                sent = b", ".join(self._transfer_codings)[:200].decode("latin-1")
                self._refuse(
                    _HeaderProblem(
                        501, "not_implemented", f"the request's Transfer-Encoding is {sent!r}",
                        "Transfer-Encoding: chunked alone, or a Content-Length (a compressed body says so in "
                        "Content-Encoding: gzip or deflate)",
                    )
                )  # fmt: skip
        path = self.url.partition(b"?")[0]
        if b"%" in path and CONTROL.search(unquote_to_bytes(path)):
            self._refuse(
                _HeaderProblem(
                    400, "bad_request", f"the path {path[:200]!r} holds an encoded control character",
                    "a path without control characters (%00-%1F, %7F)",
                )
            )  # fmt: skip
        if len(self.pipeline) >= MAX_PIPELINED - 1:  # those queued, and the one being answered
            self._refuse(
                _HeaderProblem(
                    429, "too_many_pipelined", f"over {MAX_PIPELINED} requests sent ahead of their answers",
                    f"at most {MAX_PIPELINED} requests awaiting their answers on a connection (HTTP/1.1 pipelining)",
                )
            )  # fmt: skip
        if upgrade and any(
            name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0")
            for name, value in self.headers  # uvicorn's, names lowercased
        ):
            self._refuse(
                _HeaderProblem(
                    400, "bad_request", "a request asking to upgrade the connection carries a body",
                    "the request without Connection: upgrade: this server speaks HTTP/1.1 and upgrades to nothing",
                )
            )  # fmt: skip

    def _refuse(self, error: ServiceError) -> NoReturn:
        self._refused = error
        raise _Refused(error)

    def _too_large(self) -> ServiceError:
        return _HeaderProblem(
            431, "headers_too_large", f"the request line and headers exceed {self.max_header_bytes} bytes",
            f"at most {self.max_header_bytes} bytes of headers (CGSERVE_MAX_HEADER_BYTES)",
        )  # fmt: skip

    def on_headers_complete(self) -> None:
        upgrade = self.parser.should_upgrade()  # Connection: upgrade (h2c, websocket) or CONNECT
        self._check_head(upgrade)
        if self._timer is not None:
            self._disarm()
        self._in_headers = False
        self._header_bytes = self._body_bytes = 0
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[FIRST_BYTE_KEY] = self._first_byte or time.monotonic()
        self._first_byte = None
        self._starting = True
        try:
            super().on_headers_complete()  # the ASGI task starts, or is queued behind a pipelined request
        finally:
            self._starting = False
        # A cycle of this head's (uvicorn made none for a websocket it takes over): answered, then closed, since
        # httptools dropped the rest of this read, and would read what follows as a new request's head.
        if upgrade and self.cycle is not None and self.cycle.scope is self.scope:
            self.cycle.keep_alive = False

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol's: bool | None
        """The client half-closed: where a request of it is whole and its answer still owed, the connection
        stays open to write it (and those pipelined behind it) and closes after the last (True); otherwise it
        closes now, as uvicorn's would (a body cut short will never be whole). Before, the transport closed at
        once and the request in flight was cancelled unanswered."""
        if self.scheme == "https":  # asyncio's TLS transport closes regardless, and warns where True is returned
            return None
        cycle = self.cycle
        if self._in_headers and cycle is not None and not cycle.response_complete and not self.transport.is_closing():
            if self._last_words is None:  # else the refusal waiting behind the answers closes the connection
                cycle.keep_alive = False  # the newest request: its answer says Connection: close, then closes
            return True
        return None

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        inline = self._hooks.inline if self._hooks is not None else self.inline
        # Not while the client leaves our answers unread (uvicorn's own send() waits for the drain).
        if inline is not None and self._starting and not self.flow.write_paused:
            request = inline.take(cycle)
            if request is not None:
                self._inline = (inline, request)  # answered when its body is whole (on_message_complete)
                return
        super()._start_asgi_task(cycle, self._quiet_on_reset(cycle, app))

    def _quiet_on_reset(self, cycle: RequestResponseCycle, app: Any) -> Any:
        """`app`, with a client's reset taken as its leaving, not as the app's error. uvloop closes the
        transport at once on ECONNRESET and calls connection_lost a loop turn later; an answer sent in
        between met a closed transport (RuntimeError: "the handler is closed"), which uvicorn logged as
        "Exception in ASGI application" with a traceback, one per client that hung up under load. Only
        `send` is watched: the app's own errors are logged as ever."""

        async def run(scope: Any, receive: Any, send: Any) -> None:
            async def sending(message: Any) -> None:
                try:
                    if message["type"] == "http.response.start" and self._rest_too_long_to_linger(cycle):
                        await self._send_closing(cycle, send, message)
                    else:
                        await send(message)
                except RuntimeError:
                    if not self.transport.is_closing():
                        raise  # the app's own error (a message out of order): uvicorn logs it
                    cycle.disconnected = True  # as connection_lost will say: later sends return at once

            await app(scope, receive, sending)

        return run

    def _rest_too_long_to_linger(self, cycle: RequestResponseCycle) -> bool:
        """Whether `cycle`'s answer starts before its body is whole with a rest the linger will not take whole: chunked
        (its length unknown), or more than LINGER_BYTES still to come."""
        if self._in_headers or cycle is not self.cycle:  # whole (nearly always), or a pipelined request's answer
            return False
        declared = next((value for name, value in cycle.scope["headers"] if name == b"content-length"), None)
        return declared is None or int(declared) - self._body_bytes > LINGER_BYTES  # one Content-Length: _check_head

    async def _send_closing(self, cycle: RequestResponseCycle, send: Any, message: Any) -> None:
        """The answer's head with `Connection: close`, the connection closed after the linger (on_response_complete),
        not at the answer's end as uvicorn closes a connection it has said close on (the rest unread: a reset). An
        answer that names its own Connection is uvicorn's to close (a 408 for a body too slow: at once)."""
        if any(name.lower() == b"connection" for name, _ in message.get("headers", ())):
            await send(message)
            return
        self._close_after_linger = True
        cycle.keep_alive = False  # uvicorn's send() writes the header for it ...
        try:
            await send(message)
        finally:
            cycle.keep_alive = True  # ... and reads it again at the answer's end, to close there: ours closes

    def on_message_complete(self) -> None:
        if self._timer is not None:
            self._disarm()
        if self._rate_timer is not None:
            self._stop_rate()
        if self._close_after_linger and self._lingering is not None:  # the rest came whole, after Connection: close
            self.transport.close()
            return
        self._lingering = None  # the rest came whole: the connection goes on (keep-alive, as uvicorn's)
        cycle = self.cycle
        inline = self._inline if self._inline is not None and self._inline[1].cycle is cycle else None
        if inline is not None:
            cycle.more_body = False  # as uvicorn's own says it, less the event no receive() waits on
        else:
            super().on_message_complete()
        self._last_whole = cycle
        self._in_headers = True  # what comes next on this connection is another request's head
        if inline is not None and not inline[1].answered:
            inline[0].body_complete(inline[1])

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._last_words is not None and not self._answer_owed() and not self.transport.is_closing():
            self.transport.write(self._last_words)  # the refusal of what followed the requests answered
            self.transport.close()
            return
        # Answered before its body was whole: the body being read is the answered request's own only where the
        # newest request is the one answered; behind an earlier answer it is a pipelined request's, read on.
        answered_own = self.cycle is not None and self.cycle.response_complete
        if not self._in_headers and answered_own and not self.transport.is_closing():
            self._stop_rate()
            self._lingering = 0
            self._arm(LINGER_S, self._linger_over)
        elif self._close_after_linger and not self.transport.is_closing():  # the rest came whole as it was answered
            self.transport.close()

    def _linger_over(self) -> None:
        self._timer = None
        if self._lingering is not None and not self.transport.is_closing():
            self.transport.close()

    def _stop_rate(self) -> None:
        self._window_bytes = 0
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None

    def _rate_check(self) -> None:
        """A rate window has passed while a body came in pieces: 408 where it came too slowly."""
        self._rate_timer = None
        cycle = self.cycle
        if self._in_headers or cycle is None or self.transport.is_closing() or cycle.response_complete:
            return
        inline = self._inline is not None and self._inline[1].cycle is cycle
        ours = not inline and (self.flow.read_paused or bool(cycle.body))  # the app has yet to take what came
        if ours or self._window_bytes >= self.body_min_rate_bytes_s * self.body_rate_window_s:
            self._window_bytes = 0
            self._rate_timer = timers.call_at(time.monotonic() + self.body_rate_window_s, self._rate_check)
            return
        self._body_failed(BodyTooSlowError(self.body_min_rate_bytes_s, self.body_rate_window_s))

    def _arm(self, timeout_s: float, on_timeout: Callable[[], None]) -> None:
        self._disarm()
        # The coarse timer: one per request on the hot path (the header's), and it almost never fires.
        self._timer = timers.call_at(time.monotonic() + timeout_s, on_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout(self) -> None:
        self._timer = None
        if self._in_headers and not self.transport.is_closing():
            if self._first_byte is None:  # nothing sent at all: no answer owed
                self.transport.close()
                return
            self._answer_and_close(
                _HeaderProblem(
                    408, "header_timeout", f"the request's headers did not arrive within {self.header_timeout_s:g} s",
                    "the whole request head sent at once (CGSERVE_HEADER_TIMEOUT_S)",
                )
            )  # fmt: skip

    def _body_timeout(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self._in_headers or cycle is None or self.transport.is_closing():
            return
        if cycle.response_complete:  # answered before its body came (a refusal): nothing more is owed
            self.transport.close()
            return
        inline = self._inline is not None and self._inline[1].cycle is cycle
        if self.flow.read_paused and not inline:  # the pause is ours (the app has yet to take what came)
            self._arm(self.body_timeout_s, self._body_timeout)
            return
        self._body_failed(RequestTimeoutError(self.body_timeout_s))

    def _body_failed(self, error: RequestTimeoutError) -> None:
        """408 for the body still coming: answered here (inline) or by the app's next receive()."""
        cycle = self.cycle
        assert cycle is not None
        self._disarm()
        self._stop_rate()
        if self._inline is not None and self._inline[1].cycle is cycle:
            handler, request = self._inline
            handler.fail(request, error)  # answered, and closed
            return
        extensions: dict[str, Any] = cycle.scope["extensions"]  # set in on_headers_complete
        extensions[BODY_TIMED_OUT_KEY] = error
        cycle.message_event.set()  # the app's receive() returns; app/http/limits.py raises the 408

    def _answer_and_close(self, error: ServiceError) -> None:
        """Answer `error` and close; where a request before it is still owed its answer (pipelined, then a
        head refused or not parseable), after that answer and those queued behind it, as nginx does."""
        self._disarm()
        if self._last_words is not None:  # a refusal already waits to be written: it is the answer
            return
        body = error_body(error)
        head = [b"HTTP/1.1 %d %s" % (error.status, REASONS.get(error.status, b"Error"))]
        head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
        head += [f"{name}: {value}".encode() for name, value in error.headers.items()]
        last_words = b"\r\n".join(head) + b"\r\n\r\n" + body
        if self._answer_owed():
            self._last_words = last_words  # written by on_response_complete, which then closes
            self.transport.pause_reading()  # what would come meanwhile is not read (uvicorn's flow does not resume it)
            return
        self.transport.write(last_words)
        self.transport.close()

    def _answer_owed(self) -> bool:
        """Between requests, with an earlier one's answer still to write (the refused head is not its own)."""
        cycle = self.cycle
        return self._in_headers and cycle is not None and not cycle.response_complete and not cycle.disconnected


# What GuardedHttpProtocol overrides or calls of uvicorn's protocol: each must be there to be called.
SERVER_NEEDS = (
    "_start_asgi_task",
    "send_400_response",
    "on_response_complete",
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "timeout_keep_alive_handler",
    "shutdown",  # DrainingHttpProtocol's
)  # data_received, connection_made and _lost: asyncio.Protocol's own, public


def check_server(base: type = HttpToolsProtocol) -> None:
    """SystemExit (one line, status 1) where the installed uvicorn's protocol lacks what this
    module overrides or calls."""
    missing = [name for name in SERVER_NEEDS if not callable(getattr(base, name, None))]
    if missing:
        raise SystemExit(
            f"cannot start: uvicorn {uvicorn.__version__}'s {base.__name__} has no {', '.join(missing)}, which "
            f"app/http/protocol.py's protocol needs; install the uvicorn pyproject.toml names (pip install -e .)"
        )


class DrainingHttpProtocol(GuardedHttpProtocol):
    """uvicorn closes an idle keep-alive connection at shutdown at once. Its client may have written
    its next request already (in flight, or in our socket's buffer, unread): closed under it, the
    request is lost, and with unread bytes the kernel resets the connection. Here a connection in
    shutdown answers what comes with `Connection: close` and closes after that answer; one that
    sends nothing is closed at its keep-alive timeout, as any idle connection is."""

    _closing = False

    def shutdown(self) -> None:
        self._closing = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # the answer says Connection: close, then closes
        for cycle, _ in self.pipeline:
            cycle.keep_alive = False
        if (self.cycle is None or self.cycle.response_complete) and self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self._closing and self.cycle is not None:
            self.cycle.keep_alive = False  # before it is answered: inline and ASGI answers come later


def write_answer(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """The whole answer in one write, as uvicorn's send() would write it in two; then uvicorn's
    own bookkeeping (keep-alive timer, the next pipelined request)."""
    if cycle.disconnected or cycle.transport.is_closing():
        cycle.response_complete = True
        return
    connection = dict(headers).get(b"connection")
    if connection is not None:  # an answer that closes the connection (a refusal): said once, below
        if b"close" in connection.lower():
            cycle.keep_alive = False
        headers = [(name, value) for name, value in headers if name != b"connection"]
    lines = [*map(b": ".join, cycle.default_headers), *map(b": ".join, headers)]  # content-length and -type among them
    if not cycle.keep_alive:
        lines.append(b"connection: close")
    cycle.transport.write(b"".join((STATUS_LINE[status], b"\r\n".join(lines), b"\r\n\r\n", body)))
    cycle.response_complete = True
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
