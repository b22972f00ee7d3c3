"""app/ops/log_limits.py: a line any client can cause, at most once a period, saying how many it left out."""

from __future__ import annotations

import logging

from app.ops.log_limits import OncePerPeriod


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, None, None)


def test_one_line_a_period_then_the_count_left_out() -> None:
    limit = OncePerPeriod("Invalid HTTP request received.", period_s=60)
    assert limit.filter(record("Invalid HTTP request received."))
    assert not any(limit.filter(record("Invalid HTTP request received.")) for _ in range(9))
    assert limit.filter(record("another line"))  # other lines pass, and are not counted
    limit.next_s = 0.0  # the period is over
    line = record("Invalid HTTP request received.")
    assert limit.filter(line)
    assert line.getMessage() == "Invalid HTTP request received. (9 more in the last 60 s, not logged)"
