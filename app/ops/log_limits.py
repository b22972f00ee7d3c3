"""A log line any client can cause, written at most once a period, with how many were left out.

uvicorn logs a WARNING, "Invalid HTTP request received.", for every request httptools cannot parse, before the
protocol answers it 400 (app/http/protocol.py): a client sending garbage in a loop filled the log a line a request.
The 400s are still counted (cgserve_rejections_total); the log says that they happen, and how often.
"""

from __future__ import annotations

import logging
import time


class OncePerPeriod(logging.Filter):
    """Lets one record of `message` through each `period_s`, the count of those dropped since added to it."""

    def __init__(self, message: str, period_s: float = 60.0) -> None:
        super().__init__()
        self.message, self.period_s = message, period_s
        self.next_s = 0.0
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.message:
            return True
        now = time.monotonic()
        if now < self.next_s:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{self.message} ({self.dropped} more in the last {self.period_s:g} s, not logged)"
        self.next_s, self.dropped = now + self.period_s, 0
        return True


# uvicorn's words, as its httptools protocol logs them
INVALID_REQUEST = OncePerPeriod("Invalid HTTP request received.")
