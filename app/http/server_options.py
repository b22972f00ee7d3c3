"""How uvicorn runs the service; the benchmark's reference servers run with the same options."""

from __future__ import annotations

from typing import Any

UVICORN_OPTIONS: dict[str, Any] = {
    "access_log": False,  # per-request logging costs more than the model; metrics count requests
    "loop": "auto",  # uvloop where installed
    "http": "auto",  # httptools where installed
}
