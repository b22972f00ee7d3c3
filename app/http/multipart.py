"""The image in a multipart/form-data body's field `file`, the one way both HTTP doors read an upload.

Nearly every upload is what curl -F, httpx and browsers send: one part, named `file`, with a
filename, between the opening and the closing boundary. That shape is read here directly, a few
searches over bytes already in memory (through Starlette's form parser, which spools each file and
calls back per chunk, a small JPEG's upload cost the server 1.8 times the instructions of the same
JPEG sent as the whole body). Every other body — a preamble, several parts, a part header other
than Content-Disposition and Content-Type (a Content-Transfer-Encoding, say), a CR inside a header,
headers or a boundary past python-multipart's limits, a charset on the Content-Type, an epilogue,
anything cut short — goes to Starlette's parser (python-multipart) with the route's limits, fed in
pieces so that a large body does not hold the event loop, and the answer is what that parser says,
refusals included: the direct read only takes bodies it reads the same way (the boundary and the
part's name read by python-multipart's own parse_options_header, as Starlette reads them). One
refusal is ours: a body that ends before its closing boundary, which that parser passes over in
silence (the route would have said the field `file` was missing), gets 400 saying it was cut short.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from python_multipart.multipart import (
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_SIZE,
    MAX_BOUNDARY_LENGTH,
    parse_options_header,
)
from starlette.datastructures import Headers, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser

from app.codecs.bodies import IMAGE_EXPECTED
from app.errors import InputError, quoted

FIELD = b"file"
MAX_FILES, MAX_FIELDS = 1, 8  # the parser's limits: one upload, a few other fields at most
PART_HEADERS = (b"content-disposition", b"content-type")  # what a part may carry to be read directly
PIECE_BYTES = 64 * 1024  # what Starlette's parser is fed at a time, as a connection's reads would come


async def upload_in(content_type: bytes, body: bytes | bytearray) -> bytes:
    """The bytes of the file in field `file`; InputError (400) where the body is not multipart with one."""
    found = one_file_part(content_type, body)
    if found is not None:
        return found
    return await _parsed_by_starlette(content_type, body)


def one_file_part(content_type: bytes, body: bytes | bytearray) -> bytes | None:
    """The file of a body that is exactly one part named `file` with a filename; None for any other body.

    Layout read (RFC 7578; CRLF line ends):
        --BOUNDARY\\r\\n
        Content-Disposition: form-data; name="file"; filename="photo.jpg"\\r\\n
        Content-Type: image/jpeg\\r\\n            (optional)
        \\r\\n
        <file bytes>\\r\\n--BOUNDARY--[\\r\\n]
    """
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    # A charset makes Starlette decode the part's name with it (utf-16: no longer `file`).
    if not boundary or len(boundary) > MAX_BOUNDARY_LENGTH or b"charset" in options:
        return None
    opening, delimiter = b"--" + boundary + b"\r\n", b"\r\n--" + boundary
    if not body.startswith(opening):
        return None
    head_end = body.find(b"\r\n\r\n", len(opening) - 2)
    if head_end < 0:
        return None
    lines = bytes(body[len(opening) : head_end]).split(b"\r\n")
    if len(lines) > DEFAULT_MAX_HEADER_COUNT:
        return None
    disposition = None
    for line in lines:
        name, colon, value = line.partition(b": ")
        if not colon or name.lower() not in PART_HEADERS or value[:1] in (b" ", b"\t"):
            return None
        if b"\r" in line or len(line) > DEFAULT_MAX_HEADER_SIZE:  # python-multipart refuses both
            return None
        if name.lower() == b"content-disposition":
            if disposition is not None:
                return None
            disposition = value
    if disposition is None:
        return None
    _, params = parse_options_header(disposition)
    if params.get(b"name") != FIELD or b"filename" not in params:
        return None
    start = head_end + 4
    end = body.find(delimiter, start)  # the first delimiter after the part's head must close the body
    closing = delimiter + b"--"
    after = len(body) - end - len(closing)  # 0, or 2 for a final CRLF
    if end < 0 or not body.startswith(closing, end) or after not in (0, 2):
        return None
    if after == 2 and not body.endswith(b"\r\n"):
        return None
    return bytes(memoryview(body)[start:end])


async def _parsed_by_starlette(content_type: bytes, body: bytes | bytearray) -> bytes:
    """What the route's Starlette parser makes of `body`, with its limits and its refusals."""

    async def chunks() -> AsyncGenerator[bytes, None]:
        view = memoryview(body)
        for at in range(0, len(body), PIECE_BYTES):
            yield bytes(view[at : at + PIECE_BYTES])
            await asyncio.sleep(0)  # other requests' turn between pieces

    parser = MultiPartParser(
        Headers(raw=[(b"content-type", content_type)]), chunks(), max_files=MAX_FILES, max_fields=MAX_FIELDS
    )
    try:
        form = await parser.parse()
    except (MultiPartException, HTTPException) as error:
        detail = getattr(error, "detail", None) or getattr(error, "message", str(error))
        raise InputError(
            f"the multipart body could not be parsed: {detail}",
            expected=IMAGE_EXPECTED,
            status=400,
            code="invalid_multipart",
        ) from None
    try:
        upload = form.get(FIELD.decode())
        if not isinstance(upload, UploadFile):
            # python-multipart keeps a part whose closing boundary never came to itself: say the body
            # was cut short rather than that the field was missing.
            boundary = parse_options_header(content_type)[1].get(b"boundary", b"")
            if b"--" + boundary + b"--" not in body:
                shown = quoted(boundary.decode("latin-1"))
                raise InputError(
                    f"the multipart body ends before its closing boundary (--BOUNDARY-- with boundary {shown})",
                    expected=IMAGE_EXPECTED,
                    status=400,
                    code="invalid_multipart",
                )
            raise InputError("the multipart body has no file in the field `file`", expected=IMAGE_EXPECTED)
        return await upload.read()
    finally:
        await form.close()
