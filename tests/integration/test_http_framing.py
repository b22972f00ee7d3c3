"""Each request is read as its client framed it, and answered, however the connection around it ends
(a review attacked a real server with raw sockets):

- A request asking to upgrade the connection (Connection: upgrade) makes httptools stop at its head:
  its body was never read as one and came in as the next request — a request smuggled past a proxy
  that counted one. Such a request with a body is refused (400, closed); one without is answered,
  then its connection closed.
- A client that half-closes after its request (shutdown(SHUT_WR), `nc -N`) got no answer: the
  connection closed at the client's end of bytes and the request in flight was cancelled.
- A good request with bytes that are not HTTP pipelined behind it (in one write) got only uvicorn's
  400: the connection closed at once and the good request went unanswered. It is answered first,
  then the 400, then the connection closes, as nginx does.

Against the real server on the CPU: the inline path (a whole raw body) and the ASGI route (chunked).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.server_process import running_server
from tests.reliability.common import SERVE

IMAGE = (Path(__file__).parents[2] / "models" / "examples" / "ankle-boot.u8").read_bytes()  # 1×28×28 uint8
RAW = b"Content-Type: application/octet-stream\r\n"


LOG: Path | None = None  # the server's log, for the test of what a flood of bad requests writes there


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    global LOG
    LOG = tmp_path_factory.mktemp("framing") / "server.log"
    with running_server(LOG, command=SERVE, device="cpu") as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def exchange(server: tuple[str, int], *writes: bytes, half_close: bool = False) -> bytes:
    """Everything the server writes until it closes the connection, after `writes` (each a send of its own)."""
    with socket.create_connection(server, timeout=30) as connection:
        for data in writes:
            connection.sendall(data)
        if half_close:
            connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def statuses(answer: bytes) -> list[int]:
    """Each answer's status (a pipelined answer's status line follows the last one's body directly)."""
    return [int(status) for status in re.findall(rb"HTTP/1\.[01] (\d{3}) ", answer)]


def predict_head(length: int, extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return b"POST /predict " + version + b"\r\nHost: x\r\n" + RAW + b"Content-Length: %d\r\n" % length + extra + b"\r\n"


SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"  # a second request, as the first's body
UPGRADE = b"Connection: Upgrade\r\nUpgrade: h2c\r\n"


@pytest.mark.parametrize("together", [False, True], ids=["body-later", "body-with-head"])
def test_an_upgrade_request_with_a_body_is_refused_and_its_body_is_not_a_second_request(
    server: tuple[str, int], together: bool
) -> None:
    head = predict_head(len(SMUGGLED), UPGRADE)
    writes = (head + SMUGGLED,) if together else (head, SMUGGLED)
    answer = exchange(server, *writes)
    assert statuses(answer) == [400], answer[:300]  # one answer; before, a 422 and the smuggled GET's 200
    assert b"upgrade" in answer and b'"models"' not in answer


def test_an_upgrade_request_without_a_body_is_answered_then_closed(server: tuple[str, int]) -> None:
    answer = exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + UPGRADE + b"\r\n")
    assert statuses(answer) == [200] and b"connection: close" in answer.lower(), answer[:300]


CHUNKED = (
    b"POST /predict HTTP/1.1\r\nHost: x\r\n" + RAW + b"Transfer-Encoding: chunked\r\n\r\n"
    + b"%x\r\n" % len(IMAGE) + IMAGE + b"\r\n0\r\n\r\n"
)  # fmt: skip


@pytest.mark.parametrize(
    ("codings", "status"),
    [
        (b"gzip, chunked", 501),
        (b"foo, chunked", 501),
        (b"gzip\r\nTransfer-Encoding: chunked", 501),
        (b"gzip", 501),
        (b"chunked, chunked", 400),  # httptools refuses these two itself
        (b"chunked\r\nTransfer-Encoding: gzip", 400),
    ],
)
def test_a_transfer_coding_other_than_chunked_alone_is_refused(
    server: tuple[str, int], codings: bytes, status: int
) -> None:
    """httptools framed "gzip, chunked" as chunked and dropped the gzip: a gzip body got a misleading 400, a plain
    one claimed as gzip a 200, and a proxy in front that does decode it would read another body (smuggling). Now
    501 (RFC 9112 §6.1), and the connection closes."""
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\n" + RAW + b"Transfer-Encoding: " + codings + b"\r\n\r\n"
    answer = exchange(server, head + b"%x\r\n" % len(IMAGE) + IMAGE + b"\r\n0\r\n\r\n")
    assert statuses(answer) == [status], answer[:300]
    assert b"connection: close" in answer.lower()
    assert status == 400 or b"Transfer-Encoding is" in answer


@pytest.mark.parametrize("spelt", [b"Chunked ", b"CHUNKED"])
def test_chunked_alone_is_read_however_it_is_spelt(server: tuple[str, int], spelt: bytes) -> None:
    request = CHUNKED.replace(b"chunked", spelt).replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    assert statuses(exchange(server, request)) == [200]


HALF_CLOSED = {
    "inline": [predict_head(len(IMAGE)) + IMAGE],
    "http-1.0": [predict_head(len(IMAGE), version=b"HTTP/1.0") + IMAGE],
    "asgi-chunked": [CHUNKED],
    "two-pipelined": [predict_head(len(IMAGE)) + IMAGE + CHUNKED],
}


@pytest.mark.parametrize("case", list(HALF_CLOSED))
def test_a_client_that_half_closes_after_its_request_gets_its_answer(server: tuple[str, int], case: str) -> None:
    writes = HALF_CLOSED[case]
    answer = exchange(server, *writes, half_close=True)
    expected = 2 if case == "two-pipelined" else 1
    assert statuses(answer) == [200] * expected, answer[:300]
    assert answer.count(b"Ankle boot") == expected  # each its own answer, whole


def test_a_half_close_in_the_middle_of_a_body_closes_at_once(server: tuple[str, int]) -> None:
    answer = exchange(server, predict_head(len(IMAGE)) + IMAGE[:100], half_close=True)
    assert answer == b""  # the body will never be whole: nothing to answer, no wait for its timeout


# A pipelined request whose chunk size is not hex: the parser fails in its body, not its head.
BROKEN_CHUNKS = CHUNKED.split(b"\r\n\r\n")[0] + b"\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    "after",
    [b"\x16\x03\x01 not http\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n", BROKEN_CHUNKS],
    ids=["garbage", "no-host", "broken-chunk-size"],
)
def test_a_good_request_is_answered_before_the_refusal_of_what_follows_it(
    server: tuple[str, int], after: bytes
) -> None:
    """Inline (a whole raw body), two pipelined, chunked (the ASGI route): each good request answered, then
    one 400, then closed; the same where the client half-closes after sending."""
    inline = predict_head(len(IMAGE)) + IMAGE
    for good in (inline, inline + inline, CHUNKED):
        for half_close in (False, True):
            answer = exchange(server, good + after, half_close=half_close)
            assert statuses(answer) == [200] * good.count(b"POST") + [400], (half_close, answer[:400])


def test_a_connection_holds_at_most_32_requests_awaiting_answers(server: tuple[str, int]) -> None:
    """Pipelined past 32: the 32 answered, then 429, then closed. uvicorn queued every head a read held
    (a client that pipelined GET /healthz without reading grew a server by 75 MB/s)."""
    answer = exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 40)
    assert statuses(answer) == [200] * 32 + [429], statuses(answer)
    assert b"too_many_pipelined" in answer


def test_a_flood_of_unparseable_requests_is_not_a_log_line_each(server: tuple[str, int]) -> None:
    """uvicorn logs "Invalid HTTP request received." for each: a client sending garbage in a loop filled the log.
    Each is still answered 400; the log says it at most once a minute, with how many it left out."""
    assert LOG is not None
    for _ in range(50):
        assert statuses(exchange(server, b"NOT HTTP AT ALL\r\n\r\n")) == [400]
    assert LOG.read_text().count("Invalid HTTP request received.") <= 1


def test_an_answer_before_a_large_body_is_whole_says_close_and_the_client_s_next_request_is_answered(
    server: tuple[str, int],
) -> None:
    """A gzip body that inflates past the limit is refused (413) after its first MB on the wire, as it is read; the
    connection then closes, the rest unread. Said without `Connection: close`, a keep-alive client sent its next
    request on that connection and lost it when the machine was busy (bench/results/2026-12-07-cpu-review-probes/)."""
    import gzip

    import httpx

    bomb = gzip.compress(bytes(1 << 30), 9)  # ~1 MB on the wire: past LINGER_BYTES
    zipped = {"content-encoding": "gzip", "content-type": "application/octet-stream"}
    raw = {"content-type": "application/octet-stream"}
    with httpx.Client(base_url=f"http://{server[0]}:{server[1]}", timeout=30) as client:
        for _ in range(3):
            refused = client.post("/predict", content=bomb, headers=zipped)
            assert refused.status_code == 413 and refused.headers["connection"] == "close", refused.headers
            assert client.post("/predict", content=IMAGE, headers=raw).status_code == 200
