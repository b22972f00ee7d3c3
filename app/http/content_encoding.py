"""Request bodies a client compressed: `Content-Encoding: gzip` or `deflate`, as Triton's HTTP server takes them
(tritonclient's `request_compression_algorithm` sends them, and said nothing useful here before: the compressed
bytes were read as the inference header).

The request guard (app/http/limits.py) inflates the body as it arrives and charges each slice as it charges a
chunk that came as it is, so that every limit holds for the inflated bytes: CGSERVE_MAX_BODY_BYTES (413 one slice
past it: a small body that would inflate to gigabytes costs at most that) and the bytes in flight
(CGSERVE_MAX_INFLIGHT_BYTES). A slice is at
most SLICE_BYTES, the loop's other work running between two, so that no body holds the event loop for long
(16 MiB inflated at once took ~65 ms of it). The routes read an ordinary body. The inline path (app/http/inline.py)
leaves such a request to them, and the front door refuses one.

    Inflater(encoding)             415 (InputError) for an encoding other than gzip or deflate
      .feed(data, last) -> bytes   the first slice of what `data` inflates to; `last`: the body's last bytes
      .more() -> bytes             the next slice, while .pending
"""

from __future__ import annotations

import zlib

from app.errors import InputError

ACCEPTED = "a body as it is, or compressed whole with Content-Encoding: gzip or deflate"
SLICE_BYTES = 256 * 1024  # inflated at most per step: ~1 ms of the loop
# "deflate" is zlib's format (RFC 9110); some clients send the raw stream: both are read. 32 + MAX_WBITS reads
# zlib's or gzip's wrapper, whichever the stream has.
_WRAPPED, _RAW = 32 + zlib.MAX_WBITS, -zlib.MAX_WBITS
_GZIP_MAGIC = b"\x1f\x8b"


class Inflater:
    def __init__(self, encoding: str) -> None:
        self.encoding = encoding.strip().lower()
        if self.encoding not in ("gzip", "x-gzip", "deflate"):
            raise InputError(f"Content-Encoding {encoding[:40]!r} is not accepted", expected=ACCEPTED, status=415,
                             code="unsupported_media_type")  # fmt: skip
        self._stream = zlib.decompressobj(_WRAPPED)
        self._started = False  # a first byte inflated: a raw deflate stream is told apart before it
        self._fed = b""  # the input before that: read again as a raw deflate stream where zlib's header is not
        self._tail = b""  # input not yet inflated
        self._last = False  # the body's last bytes were fed
        self._full = False  # the last slice filled SLICE_BYTES: zlib may hold more output

    @property
    def pending(self) -> bool:
        """More of what was fed is still to come out (.more())."""
        return bool(self._tail) or (self._full and not self._stream.eof)

    def feed(self, data: bytes, last: bool) -> bytes:
        assert not self.pending, "the slices of the last bytes fed are taken first"
        self._tail, self._last = data, last
        return self.more()

    def more(self) -> bytes:
        try:
            out = self._inflate()
        except zlib.error as error:
            raise self._refusal(str(error)) from None
        if self._last and not self.pending:
            self._check_whole()
        return out

    def _inflate(self) -> bytes:
        data, self._tail = self._tail, b""
        if not self._started:
            self._fed += data
        try:
            out = self._stream.decompress(data, SLICE_BYTES)
        except zlib.error:
            if self._started or self.encoding != "deflate":
                raise
            self._stream = zlib.decompressobj(_RAW)  # a raw deflate stream, without zlib's header
            out = self._stream.decompress(self._fed, SLICE_BYTES)
        if out and not self._started:
            self._started, self._fed = True, b""
        self._tail = self._stream.unconsumed_tail
        if self._stream.eof and self._stream.unused_data[:2] == _GZIP_MAGIC and self.encoding != "deflate":
            # gzip's next member (gzip allows several, one after the other): inflated on the next slice
            self._tail, self._stream = self._stream.unused_data + self._tail, zlib.decompressobj(_WRAPPED)
        self._full = len(out) == SLICE_BYTES
        return out

    def _check_whole(self) -> None:
        if not self._stream.eof:
            raise self._refusal("the compressed stream ends early")
        if self._stream.unused_data:
            raise self._refusal(f"{len(self._stream.unused_data)} bytes follow the end of the compressed stream")

    def _refusal(self, why: str) -> InputError:
        return InputError(f"the body is not {self.encoding} data as its Content-Encoding says ({why})",
                          expected=ACCEPTED, status=400, code="bad_request")  # fmt: skip
