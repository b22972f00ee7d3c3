"""Request bodies a client compressed: `Content-Encoding: gzip` or `deflate`, as Triton's HTTP server takes them
(tritonclient's `request_compression_algorithm` sends them, and said nothing useful here before: the compressed
bytes were read as the inference header).

The body limit (CGSERVE_MAX_BODY_BYTES) holds for the inflated bytes: inflating stops one byte past it, so a small
body that would inflate to gigabytes costs at most the limit, then 413. Only the Starlette routes inflate
(app/http/answer.py's whole_body); the inline and fast paths leave a compressed body to them, as the front door
refuses one.

    inflated(body, encoding, limit) -> bytes    encoding as the header gives it ("" or "identity": as it came)
"""

from __future__ import annotations

import zlib

from app.errors import BodyTooLargeError, InputError

ACCEPTED = "a body as it is, or compressed whole with Content-Encoding: gzip or deflate"
# "deflate" is zlib's format (RFC 9110); some clients send the raw stream: both are read. gzip's header is told
# apart by zlib itself (32 + MAX_WBITS reads either wrapper).
_WRAPPED, _RAW = 32 + zlib.MAX_WBITS, -zlib.MAX_WBITS


def inflated(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` inflated: InputError 415 for another encoding, 400 for bytes that are not one whole stream of it,
    BodyTooLargeError (413) past `limit` bytes inflated."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise InputError(f"Content-Encoding {encoding!r} is not accepted", expected=ACCEPTED, status=415,
                         code="unsupported_media_type")  # fmt: skip
    try:
        return _inflate(body, _WRAPPED, limit)
    except zlib.error as error:
        if encoding == "deflate":  # a raw deflate stream, without zlib's header
            try:
                return _inflate(body, _RAW, limit)
            except zlib.error:
                pass
        raise InputError(f"the body is not {encoding} data as its Content-Encoding says ({error})",
                         expected=ACCEPTED, status=400, code="bad_request") from None  # fmt: skip


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)  # one byte past the limit: enough to know it is over
    if len(out) > limit:
        raise BodyTooLargeError(limit)
    if not inflater.eof:
        raise zlib.error("the compressed stream ends early")
    if inflater.unused_data:
        raise zlib.error(f"{len(inflater.unused_data)} bytes follow the end of the compressed stream")
    return out
