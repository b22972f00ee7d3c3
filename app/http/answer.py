"""An HTTP answer as the data plane's codecs write it: status, body and headers, for any front end.

The Starlette routes hand it over as a Response; the raw ASGI fast path (app/http/fast_path.py)
and the inline path in the protocol (app/http/inline.py) write it themselves. HTTP requests reach a
codec as an HttpBody: what was read, whichever front end read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from app.errors import ClientClosedError, ServiceError, error_body

JSON_TYPE = (b"content-type", b"application/json")


@dataclass(slots=True)
class HttpBody:
    body: bytes | bytearray  # the connection's buffer itself on the inline path (not copied)
    media: str  # the Content-Type without parameters, lower case ("" where absent)
    query: str  # the raw query string
    header_length: str | None = None  # the v2 binary extension's Inference-Header-Content-Length
    content_type: bytes = b""  # the first Content-Type whole: a multipart body's boundary is in it


@dataclass(slots=True)
class HttpAnswer:
    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: [JSON_TYPE])  # content-type among them

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"content-length", b"%d" % len(self.body)), *self.headers]

    def response(self) -> Response:
        response = Response(self.body, status_code=self.status)
        response.raw_headers = self.raw_headers()
        return response


async def whole_body(request: Request) -> bytes:
    """A Starlette request's body (inflated by the guard where the client compressed it); ClientClosedError where
    the client went away before it was whole."""
    try:
        return await request.body()
    except ClientDisconnect:
        raise ClientClosedError("the client went away before its answer") from None


def error_answer(error: ServiceError, *, v2: bool = False) -> HttpAnswer:
    """The service's {"error": {…}} envelope, or the Open Inference Protocol's {"error": "…"}, where a 422 is
    Triton's 400; with the error's own headers (Retry-After)."""
    status = 400 if v2 and error.status == 422 else error.status
    headers = [JSON_TYPE, *((k.lower().encode(), v.encode()) for k, v in error.headers.items())]
    return HttpAnswer(status, error_body(error, v2=v2), headers)
