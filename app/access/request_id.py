"""X-Request-ID: the client's if it is sane, else a new one; echoed on every answer and put in
every log line written while the request is handled.

The id lives in a context variable, set for the request's task (HTTP: RequestContextMiddleware,
app/access/request_context.py; gRPC: app/access/grpc_interceptor.py). RequestIdFilter, on the root
logger's handlers, copies it into each record: as `record.request_id` for a format that names
`%(request_id)s`, and otherwise (today's format in app/cli.py) at the head of the message, "[<id>] …".
"""

from __future__ import annotations

import logging
import random
import re
from contextvars import ContextVar

HEADER = "x-request-id"
_SANE = re.compile(rb"[A-Za-z0-9._-]{1,128}")  # whole: fullmatch (`$` passes a final newline)
# A uuid4's version and variant bits, over random ones: uuid.uuid4() costs 7 µs, this 0.5.
_UUID4_MASK = ~(0xF000 << 64 | 0xC000 << 48) & (2**128 - 1)
_UUID4_BITS = 0x4000 << 64 | 0x8000 << 48

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)


def choose(incoming: bytes | str | None) -> str:
    """The client's id when it is 1–128 of [A-Za-z0-9._-], else a new uuid4 hex (32 characters;
    not from os.urandom: an id must be unique, not unguessable)."""
    if incoming:
        raw = incoming.encode() if isinstance(incoming, str) else incoming
        if _SANE.fullmatch(raw):
            return raw.decode()
    return f"{random.getrandbits(128) & _UUID4_MASK | _UUID4_BITS:032x}"


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record ("-" outside a request); with `into_message`, also puts
    "[<id>] " at the head of the message of records written inside one (once per record, however
    many handlers it passes)."""

    def __init__(self, *, into_message: bool) -> None:
        super().__init__()
        self.into_message = into_message

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        record.request_id = request_id or "-"
        if request_id and self.into_message and not getattr(record, "_request_id_in_message", False):
            # The id is [A-Za-z0-9._-] only: no %, so %-formatting with record.args is unchanged.
            record.msg = f"[{request_id}] {record.msg}"
            record._request_id_in_message = True
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """RequestIdFilter on each handler of `logger` (the root's by default) that has none yet."""
    for handler in (logger or logging.getLogger()).handlers:
        if any(isinstance(f, RequestIdFilter) for f in handler.filters):
            continue
        fmt = getattr(handler.formatter, "_fmt", None) or ""
        handler.addFilter(RequestIdFilter(into_message="%(request_id)" not in fmt))
