"""An upload's file read directly where the body is the common one-part shape, and by Starlette's
parser otherwise: the same bytes, or the same refusal, either way (app/http/multipart.py)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.errors import InputError
from app.http.multipart import PIECE_BYTES, _parsed_by_starlette, one_file_part, upload_in

FILE = bytes(range(256)) * 40 + b"\r\n--not-the-boundary\r\n\r\n"  # CRLFs and dashes inside the file too
TYPE = b"multipart/form-data; boundary=b0undary"


def built_by_httpx(data: bytes = FILE, field: str = "file", **extra: str) -> tuple[bytes, bytes]:
    """(Content-Type, body) as httpx (and so most Python clients) send an upload."""
    request = httpx.Request("POST", "http://x/", files={field: ("photo.jpg", data, "image/jpeg")}, data=extra)
    return request.headers["content-type"].encode(), request.read()


def body(*lines: bytes, boundary: bytes = b"b0undary", data: bytes = FILE, end: bytes = b"--\r\n") -> bytes:
    """One part with these header lines, as curl -F writes it (its closing CRLF after `end`)."""
    return (
        b"--"
        + boundary
        + b"\r\n"
        + b"".join(line + b"\r\n" for line in lines)
        + b"\r\n"
        + data
        + b"\r\n--"
        + boundary
        + end
    )


DISPOSITION = b'Content-Disposition: form-data; name="file"; filename="photo.jpg"'
# Bodies read directly: what clients send.
DIRECT = {
    "curl": (TYPE, body(DISPOSITION, b"Content-Type: image/jpeg")),
    "no part content type": (TYPE, body(DISPOSITION)),
    "no closing CRLF": (TYPE, body(DISPOSITION, end=b"--")),
    "quoted boundary": (b'multipart/form-data; boundary="b0undary"', body(DISPOSITION)),
    "header names in any case": (TYPE, body(DISPOSITION.lower(), b"CONTENT-TYPE: image/jpeg")),
    "empty file": (TYPE, body(DISPOSITION, data=b"")),
    "httpx": built_by_httpx(),
}
# Bodies left to Starlette's parser: its answer, whatever it is.
ELSEWHERE = {
    "two fields": built_by_httpx(note="hello"),
    "another field's name": built_by_httpx(field="image"),
    "no filename: a field, not a file": (TYPE, body(b'Content-Disposition: form-data; name="file"')),
    "a transfer encoding": (TYPE, body(DISPOSITION, b"Content-Transfer-Encoding: base64", data=b"aGVsbG8=")),
    "no boundary": (b"multipart/form-data", body(DISPOSITION)),
    "a preamble": (TYPE, b"hello\r\n" + body(DISPOSITION)),
    "an epilogue": (TYPE, body(DISPOSITION, end=b"--\r\nbye")),
    "cut short": (TYPE, body(DISPOSITION)[:-40]),
    "the delimiter inside the file": (TYPE, body(DISPOSITION, data=b"x\r\n--b0undaryx")),
    "two parts": (TYPE, body(DISPOSITION)[: -len(b"--\r\n")] + b"\r\n" + body(DISPOSITION)[len(b"--b0undary\r\n") :]),
    "not multipart at all": (TYPE, b"{}"),
    "header without a space": (TYPE, body(b'Content-Disposition:form-data; name="file"; filename="a"')),
    # Past python-multipart's limits, or read otherwise by it (found by review: each was read directly
    # while Starlette's parser refused it or found no `file`).
    "a lone CR in a header": (TYPE, body(b'Content-Disposition: form-data; name="file"; filename="a\rb"')),
    "a header line past the size limit": (TYPE, body(DISPOSITION[:-1] + b"x" * 5000 + b'"')),
    "more header lines than allowed": (TYPE, body(DISPOSITION, *[b"Content-Type: image/jpeg"] * 8)),
    "a boundary past 256 bytes": (
        b"multipart/form-data; boundary=" + b"b" * 300,
        body(DISPOSITION, boundary=b"b" * 300),
    ),
    "a charset on the content type": (TYPE + b"; charset=utf-16", body(DISPOSITION)),
}


def starlette(content_type: bytes, data: bytes) -> bytes | tuple[int, str]:
    try:
        return asyncio.run(_parsed_by_starlette(content_type, data))
    except InputError as error:
        return error.status, str(error)


@pytest.mark.parametrize("name", list(DIRECT))
def test_what_clients_send_is_read_directly_as_starlette_reads_it(name: str) -> None:
    content_type, data = DIRECT[name]
    found = one_file_part(content_type, data)
    assert found is not None, name
    assert found == starlette(content_type, data)
    assert one_file_part(content_type, bytearray(data)) == found  # the inline path hands over its bytearray


@pytest.mark.parametrize("name", list(ELSEWHERE))
def test_every_other_body_is_left_to_starlette(name: str) -> None:
    content_type, data = ELSEWHERE[name]
    assert one_file_part(content_type, data) is None, (
        f"read directly, where Starlette says {starlette(content_type, data)!r}"
    )


def test_starlettes_parser_is_fed_in_pieces_with_the_loop_free_between_them() -> None:
    """A large body the direct read leaves (here: a field beside the file) must not hold the event loop
    for the whole parse: other coroutines run between the pieces."""
    content_type, data = built_by_httpx(FILE * 100, note="hello")  # ~1 MB
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def both() -> bytes:
        ticker = asyncio.create_task(ticking())
        try:
            return await upload_in(content_type, data)
        finally:
            ticker.cancel()

    assert asyncio.run(both()) == FILE * 100
    assert ticks >= len(data) // PIECE_BYTES


def test_refusals_say_what_was_wrong_and_what_is_expected() -> None:
    with pytest.raises(InputError, match="no file in the field `file`") as no_file:
        asyncio.run(upload_in(*ELSEWHERE["another field's name"]))
    with pytest.raises(InputError, match="could not be parsed: Missing boundary") as no_boundary:
        asyncio.run(upload_in(*ELSEWHERE["no boundary"]))
    with pytest.raises(InputError, match="Too many files") as two_files:
        asyncio.run(upload_in(*ELSEWHERE["two parts"]))
    with pytest.raises(InputError, match=r"ends before its closing boundary .* 'b0undary'") as cut_short:
        asyncio.run(upload_in(*ELSEWHERE["cut short"]))
    for refused in (no_file, no_boundary, two_files, cut_short):
        assert refused.value.status in (400, 422) and "multipart/form-data" in refused.value.expected
