"""Request heads the guarded protocol (app/http/protocol.py) refuses before any route, the ASGI one
or the inline one, sees them: too large however they arrive, ambiguous Host or Authorization
headers, control characters in the percent-decoded path (issues 24.1, 24.8).

Raw bytes into the protocol in-process, on the recording transport of test_inline_protocol.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.http.inline import InlineRequest
from app.http.protocol import GuardedHttpProtocol
from tests.unit.test_inline_protocol import StubInline, asgi_calls, connected, settle


class TakesEveryPost(StubInline):
    """The inline handler as app/http/inline.py would be for any POST it may answer."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[str] = []

    def take(self, cycle: Any) -> InlineRequest | None:
        if cycle.scope["method"] != "POST":
            return None
        self.taken.append(cycle.scope["path"])
        return super().take(cycle)


@pytest.fixture
def inline(monkeypatch: pytest.MonkeyPatch) -> TakesEveryPost:
    stub = TakesEveryPost()
    monkeypatch.setattr(GuardedHttpProtocol, "inline", stub)
    monkeypatch.setattr(GuardedHttpProtocol, "max_header_bytes", 65536)
    asgi_calls.clear()
    return stub


def status(written: bytes) -> int:
    return int(written.split(b" ", 2)[1])


async def sent(head: bytes, body: bytes = b"") -> tuple[bytes, bool]:
    """What the protocol wrote, and whether it closed the connection, after `head` and `body`."""
    protocol, transport = await connected()
    protocol.data_received(head + body)
    await settle()
    return bytes(transport.written), transport.closed


@pytest.mark.anyio
@pytest.mark.parametrize("size", [70_000, 100_000])
async def test_a_large_head_in_one_write_gets_431(inline: TakesEveryPost, size: int) -> None:
    head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-filler: " + b"a" * size + b"\r\n\r\n"
    written, closed = await sent(head)
    assert status(written) == 431 and closed
    assert not asgi_calls


@pytest.mark.anyio
async def test_many_headers_in_one_write_past_the_limit_get_431(inline: TakesEveryPost) -> None:
    filler = b"".join(b"x-h%d: %s\r\n" % (n, b"b" * 100) for n in range(800))  # ~90 KB in 800 headers
    written, closed = await sent(b"POST /predict HTTP/1.1\r\nhost: x\r\n" + filler + b"content-length: 0\r\n\r\n")
    assert status(written) == 431 and closed
    assert not asgi_calls and not inline.taken


@pytest.mark.anyio
async def test_a_head_just_under_the_limit_is_served(inline: TakesEveryPost) -> None:
    head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-filler: " + b"a" * 60_000 + b"\r\n\r\n"
    written, closed = await sent(head)
    assert status(written) == 200 and not closed
    assert asgi_calls == ["/healthz"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\nhost: a\r\nHost: a\r\n\r\n",
        b"POST /predict HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=["1.1 without Host", "1.1 with two", "1.0 with two", "inline route without Host"],
)
async def test_a_missing_or_doubled_host_gets_400(inline: TakesEveryPost, head: bytes) -> None:
    written, closed = await sent(head)
    assert status(written) == 400 and closed
    assert b"Host" in written
    assert not asgi_calls and not inline.taken


@pytest.mark.anyio
async def test_http_1_0_without_host_is_served(inline: TakesEveryPost) -> None:
    written, _ = await sent(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert status(written) == 200 and asgi_calls == ["/healthz"]


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/predict", "/v2/models/m/infer", "/metrics"])
async def test_two_authorization_headers_get_400(inline: TakesEveryPost, path: str) -> None:
    method = b"GET" if path == "/metrics" else b"POST"
    head = method + b" " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n"
    head += b"authorization: Bearer first-token-0123456789\r\nAuthorization: Bearer second-token-0123456789\r\n\r\n"
    written, closed = await sent(head)
    assert status(written) == 400 and closed and b"Authorization" in written
    assert not asgi_calls and not inline.taken


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/x%0Ay/infer"),  # the inline route's
        ("POST", "/v1/models/x%0a/predict"),
        ("POST", "/predict%00"),
        ("GET", "/v1/models/x%0Ay/ready"),  # the ASGI route's
        ("GET", "/metrics%0D%0A"),
        ("GET", "/v2/models/x%7F/ready"),
    ],
)
async def test_an_encoded_control_character_in_the_path_gets_400(
    inline: TakesEveryPost, method: str, path: str
) -> None:
    head = f"{method} {path}?q=%0A HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n".encode()
    written, closed = await sent(head, b"{}")
    assert status(written) == 400 and closed and b"control character" in written
    assert not asgi_calls and not inline.taken


@pytest.mark.anyio
async def test_an_encoded_newline_in_the_query_alone_is_served(inline: TakesEveryPost) -> None:
    written, _ = await sent(b"GET /healthz?note=a%0Ab HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status(written) == 200 and asgi_calls == ["/healthz"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "head",
    [
        b"GET /a\x01b HTTP/1.1\r\nhost: x\r\n\r\n",  # a raw control character in the path
        b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n",
        b"GET /healthz HTTP/1.1\nhost: x\n\n",  # bare LF line endings
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
)
async def test_a_request_httptools_cannot_parse_gets_400_in_the_services_error_shape(
    inline: TakesEveryPost, head: bytes
) -> None:
    """uvicorn's own answer was text/plain "Invalid HTTP request received.", naming neither problem nor fix."""
    written, closed = await sent(head)
    assert status(written) == 400 and closed and b"content-type: application/json" in written
    error = orjson.loads(written.partition(b"\r\n\r\n")[2])["error"]  # one answer (its text names HTTP/1.1)
    assert error["code"] == "bad_request" and "not well-formed HTTP/1.1" in error["message"]
    assert "CRLF" in error["expected"] and not asgi_calls
