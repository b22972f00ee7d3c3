"""ASGI middleware that bounds every request with a body before the handler reads it.

- Deadline: the request's end to end starts at its first byte (stamped by app/http/protocol.py's
  protocol, or now) and lasts CGSERVE_REQUEST_TIMEOUT_S, or less if the client asks
  (`X-Request-Timeout-Ms`); handlers read it from scope["cgserve.deadline"] (time.monotonic()).
- Size: a declared Content-Length over CGSERVE_MAX_BODY_BYTES is answered 413 at once; a chunked
  body is counted as it arrives, and the read that crosses the limit raises BodyTooLargeError.
- Memory: bodies being read and decoded at once are bounded by CGSERVE_MAX_INFLIGHT_BYTES. A
  request is charged what has arrived of its body, chunk by chunk, until it is answered: one
  whose declared length does not fit beside what is held gets 503 with Retry-After before a byte
  of its body is read, and a chunk that does not fit raises BudgetExhaustedError (503); a body
  larger than the whole budget, declared or found as it arrives, is 413 (no retry could fit it). Charged
  by declaration, sixteen uploads declaring 16 MiB that then trickled held all 256 MiB and every
  other request got 503 (issue 24.2).
- Slow bodies: a body that paused longer than CGSERVE_BODY_TIMEOUT_S, or came slower than
  CGSERVE_BODY_MIN_RATE_BYTES_S, raises RequestTimeoutError (408) in the handler that reads it.
  app/http/protocol.py's protocol times the body where the bytes arrive and marks the scope with the
  error; here each receive() checks the mark (no timer per request).
- Compressed bodies (Content-Encoding gzip or deflate, app/http/content_encoding.py): inflated here as
  they arrive, a slice at a time, and the size limit and the budget count the inflated bytes; the
  handler reads an ordinary body. Another encoding is answered 415 before its body is read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import (
    BodyTooLargeError,
    BudgetExhaustedError,
    InputError,
    RequestTimeoutError,
    ServiceError,
    error_body,
)
from app.http.content_encoding import Inflater
from app.http.heads import TIMEOUT_HEADER, Head, read_head
from app.ops import metrics

DEADLINE_KEY = "cgserve.deadline"
FIRST_BYTE_KEY = "cgserve.first_byte"  # set by app/http/protocol.py where the guarded protocol runs
BODY_TIMED_OUT_KEY = "cgserve.body_timed_out"  # set by app/http/protocol.py when a body pauses too long
HEAD_KEY = "cgserve.head"  # the request's Head (app/http/heads.py), read once by the guard


def deadline_of(scope: Scope, timeout_s: float) -> float:
    """The request's deadline (time.monotonic()) as the guard set it from its first byte, or `timeout_s` from
    now where no guard ran (a test's app without its middleware)."""
    deadline: float | None = scope.get(DEADLINE_KEY)
    return deadline if deadline is not None else time.monotonic() + timeout_s


class BodyTooSlowError(RequestTimeoutError):
    """The body came slower than the minimum rate (it never paused long enough for the timeout)."""

    def __init__(self, min_rate_bytes_s: int, window_s: float) -> None:
        ServiceError.__init__(
            self,
            f"the request body came slower than {min_rate_bytes_s} bytes/s over {window_s:g} s",
            expected=f"a body sent at {min_rate_bytes_s} bytes/s or faster (CGSERVE_BODY_MIN_RATE_BYTES_S)",
            headers={"Connection": "close"},
        )


class BodyBudget:
    """This process's bodies being read and decoded, in bytes, and their limit; the event loop's
    alone. Shared by this guard and the requests answered in the protocol (app/http/inline.py)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size


class _Held:
    """The bytes of one request's body charged to the budget so far."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        infer_body_bytes: int | None = None,
        budget: BodyBudget,
        request_timeout_s: float,
        body_timeout_s: float,
        on_refused: Callable[[str, Head, int], None] | None = None,
    ) -> None:
        """`on_refused(path, head, status)`: told of each request refused here, before its route (app/main.py counts
        the inference requests among them as their routes count their answers)."""
        self.app = app
        self.on_refused = on_refused
        self.max_body_bytes = max_body_bytes
        # v2 infer bodies: a model's max_batch_size of FP32 images, as its configuration promises and gRPC takes them
        # (app/protocols/v2/batch_limits.py); every other body: CGSERVE_MAX_BODY_BYTES.
        self.infer_body_bytes = max(max_body_bytes, infer_body_bytes or 0)
        self.budget = budget
        self.request_timeout_s = request_timeout_s
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        extensions = scope.get("extensions") or {}
        started = extensions.get(FIRST_BYTE_KEY) or time.monotonic()
        head = scope[HEAD_KEY] = read_head(scope["headers"])  # the fast path reads it from here too
        declared = head.length if head.length is not None and head.length >= 0 else None
        timeout_s = self.request_timeout_s
        if head.timeout_ms is not None:
            if head.timeout_ms < 0:
                values = [value for name, value in scope["headers"] if name == TIMEOUT_HEADER]
                value = b", ".join(values)
                expected = "X-Request-Timeout-Ms: a positive whole number of milliseconds (at most 12 digits)"
                shown = value[:40].decode("latin-1")  # a header's bytes, as HTTP has them; repr escapes the odd ones
                error = InputError(f"X-Request-Timeout-Ms is {shown!r}", expected=expected, status=400)
                await self._refuse(scope, send, error)
                return
            timeout_s = min(timeout_s, head.timeout_ms / 1000)
        limit, setting = self._body_limit(scope["path"], head)
        if declared is not None and declared > limit:
            await self._refuse(scope, send, BodyTooLargeError(limit, setting))
            return
        # Admission, before a byte is read: room for what it declares (a chunked body: one byte).
        if self.budget.used + (1 if declared is None else declared) > self.budget.limit:
            await self._refuse(scope, send, BudgetExhaustedError(self.budget.limit))
            return
        inflater = None
        if head.encoding:  # a compressed body: inflated as it comes, every limit counting the inflated bytes
            try:
                inflater = Inflater(head.encoding.decode("latin-1"))
            except InputError as error:  # another encoding: 415 before a byte of it is read
                await self._refuse(scope, send, error)
                return
        scope[DEADLINE_KEY] = started + timeout_s
        held = _Held()
        try:
            await self.app(scope, self._guarded(receive, extensions, held, inflater, limit, setting), send)
        finally:
            self.budget.release(held.bytes)

    def _body_limit(self, path: str, head: Head) -> tuple[int, str]:
        """The body's limit and the setting behind it: a v2 infer body in the binary form (its header's length
        given) may be a model's max_batch_size of FP32 images (app/protocols/v2/batch_limits.py); JSON's numbers
        take five times the bytes and decode to ten times more, and keep CGSERVE_MAX_BODY_BYTES as other bodies do.
        Never more than the whole in-flight budget: a larger body, declared or found as it arrives, could never be
        admitted however idle the server (413, not a 503 for ever)."""
        if head.header_length is not None and path.startswith("/v2/models/") and path.endswith("/infer"):
            limit, setting = self.infer_body_bytes, "a model's max_batch_size of FP32 images, or CGSERVE_MAX_BODY_BYTES"
        else:
            limit, setting = self.max_body_bytes, "CGSERVE_MAX_BODY_BYTES"
        return (limit, setting) if limit <= self.budget.limit else (self.budget.limit, "CGSERVE_MAX_INFLIGHT_BYTES")

    def _guarded(self, receive: Receive, extensions: dict[str, object], held: _Held,
                 inflater: Inflater | None, limit: int, setting: str) -> Receive:  # fmt: skip
        last = False  # the compressed body's last bytes have come

        def charged(message: Message) -> Message:
            size = len(message.get("body", b""))
            if held.bytes + size > limit:  # a chunked or compressed body (a declared one was checked)
                raise BodyTooLargeError(limit, setting)
            if not self.budget.reserve(size):
                raise BudgetExhaustedError(self.budget.limit)
            held.bytes += size
            return message

        async def guarded_receive() -> Message:
            nonlocal last
            if inflater is not None and inflater.pending:  # the next slice of what came, the loop's turn first
                await asyncio.sleep(0)
                more = inflater.more()
                return charged({"type": "http.request", "body": more, "more_body": inflater.pending or not last})
            message = await receive()
            timed_out = extensions.get(BODY_TIMED_OUT_KEY)
            if timed_out is not None:
                raise (
                    timed_out
                    if isinstance(timed_out, RequestTimeoutError)
                    else RequestTimeoutError(self.body_timeout_s)
                )
            if message["type"] != "http.request":
                return message
            if inflater is not None:
                last = not message.get("more_body", False)
                body = inflater.feed(message.get("body", b""), last)
                message = {"type": "http.request", "body": body, "more_body": inflater.pending or not last}
            return charged(message)

        return guarded_receive

    async def _refuse(self, scope: Scope, send: Send, error: ServiceError) -> None:
        """Answer without reading the body; the client may still be sending, so close the connection."""
        metrics.reject("", error.reason)
        body = error_body(error, v2=scope["path"].startswith("/v2"))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
        headers.append((b"connection", b"close"))
        status = 400 if error.status == 422 and scope["path"].startswith("/v2") else error.status
        if self.on_refused is not None:
            self.on_refused(scope["path"], scope[HEAD_KEY], status)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
