"""A request's head as every HTTP front end reads it: one pass over its headers, one set of rules.

The guard (app/http/limits.py), the fast path (app/http/fast_path.py) and the inline path
(app/http/inline.py) all read the same few headers; each reads them here, so that they cannot come
to disagree (the first Content-Type, as Starlette's headers.get reads it; a Content-Length given
twice or not a number; an X-Request-Timeout-Ms of more than 12 digits, which once overflowed a float).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TIMEOUT_HEADER = b"x-request-timeout-ms"
V2_HEADER_LENGTH = b"inference-header-content-length"  # the v2 binary extension's JSON header length
MAX_TIMEOUT_DIGITS = 12  # X-Request-Timeout-Ms: 31 years


@dataclass(slots=True)
class Head:
    length: int | None = None  # Content-Length; -1 where given twice or not a number
    media: bytes | None = None  # the first Content-Type, without parameters, lower case
    content_type: bytes = b""  # the first Content-Type whole (a multipart body's boundary is in it)
    header_length: bytes | None = None  # the first Inference-Header-Content-Length
    timeout_ms: int | None = None  # X-Request-Timeout-Ms (the shortest); -1 where one is not 1 to 12 digits above 0
    streamed: bool = False  # Transfer-Encoding or Expect: the body does not simply follow the head
    encoding: bytes = b""  # Content-Encoding but identity, lower case (several: joined by ","): the guard inflates


# The names read_head reads; every other header (Host, User-Agent, Accept...) costs it one set lookup.
READ = frozenset(
    (b"content-length", b"content-type", V2_HEADER_LENGTH, TIMEOUT_HEADER, b"transfer-encoding", b"expect",
     b"content-encoding")
)  # fmt: skip


def read_head(headers: Iterable[tuple[bytes, bytes]]) -> Head:
    head = Head()
    for name, value in headers:
        if name not in READ:
            continue
        if name == b"content-length":
            head.length = int(value) if value.isdigit() and head.length is None else -1
        elif name == b"content-type" and head.media is None:
            head.media, head.content_type = value.partition(b";")[0].strip().lower(), value
        elif name == V2_HEADER_LENGTH and head.header_length is None:
            head.header_length = value
        elif name == TIMEOUT_HEADER and head.timeout_ms != -1:  # one bad value refuses the request
            if value.isdigit() and len(value) <= MAX_TIMEOUT_DIGITS and int(value) > 0:
                head.timeout_ms = min(int(value), head.timeout_ms or int(value))  # several: the shortest
            else:
                head.timeout_ms = -1
        elif name in (b"transfer-encoding", b"expect"):
            head.streamed = True
        elif name == b"content-encoding" and (value := value.strip().lower()) != b"identity":
            head.encoding = head.encoding + b"," + value if head.encoding else value
    return head
