"""The access log: one JSON object a line per request, on the logger `cgserve.access`.

The event loop only builds the line (orjson) and puts the record on a queue (QueueHandler); a
thread (QueueListener) writes it to stdout, so a slow terminal or pipe never stalls serving.
The logger does not propagate: its lines stay plain JSON, apart from the diagnostic log on
stderr. Another handler added to `cgserve.access` gets the same lines.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

LOGGER = "cgserve.access"


class AccessLog:
    def __init__(self) -> None:
        self.logger = logging.getLogger(LOGGER)
        self.logger.setLevel(logging.INFO)  # on whatever CGSERVE_LOG_LEVEL says: it was asked for
        self.logger.propagate = False
        if not any(isinstance(h, logging.handlers.QueueHandler) for h in self.logger.handlers):
            # Once per process: several apps (tests) share the logger and its writer thread.
            lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
            stdout = logging.StreamHandler(sys.stdout)
            stdout.setFormatter(logging.Formatter("%(message)s"))
            listener = logging.handlers.QueueListener(lines, stdout)
            listener.start()
            atexit.register(listener.stop)  # writes what is still queued
            self.logger.addHandler(logging.handlers.QueueHandler(lines))

    def write(self, started: float, fields: dict[str, Any]) -> None:
        """One line: `time` (ISO 8601 UTC, when the request arrived) first, then `fields`."""
        time = datetime.fromtimestamp(started, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.logger.info(orjson.dumps({"time": time, **fields}).decode())
