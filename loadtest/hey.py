"""hey (github.com/rakyll/hey, Go) as a second opinion on the load generator: one closed-loop run
with one body, its per-request figures read from `hey -o csv`, its percentiles taken as ours are.

hey's CSV has a row per answered request, seconds to four decimals (0.1 ms):
response-time, DNS+dialup, DNS, Request-write, Response-delay, Response-read, status-code, offset
(offset: when the request started, from the start of the run). Requests that got no answer
(refused, timed out) have no row: `requests` counts answers only.
"""

from __future__ import annotations

import csv
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.stats import latency_summary_ms

CSV_COLUMNS = (
    "response-time",
    "DNS+dialup",
    "DNS",
    "Request-write",
    "Response-delay",
    "Response-read",
    "status-code",
    "offset",
)


def resolve_hey(path: str | None) -> str | None:
    """hey's absolute path, or None where it is absent."""
    if not path:
        return None
    if Path(path).is_file():
        return str(Path(path).resolve())
    return shutil.which(path)


def hey_command(
    hey: str, url: str, body_path: Path, *, content_type: str, concurrency: int, duration_s: float
) -> list[str]:
    """hey at `concurrency` for `duration_s`, POSTing the body in `body_path` to `url`, CSV out."""
    argv = [hey, "-z", f"{duration_s:g}s", "-c", str(concurrency), "-m", "POST", "-T", content_type]
    return [*argv, "-D", str(body_path), "-o", "csv", url]


def run_hey(argv: list[str], *, timeout_s: float) -> dict[str, Any]:
    """Run `argv` (hey_command's, perhaps behind taskset); its figures, or why there are none."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    try:
        if done.returncode != 0:
            raise ValueError(f"hey exited with {done.returncode}")
        result = parse_hey_csv(done.stdout)
    except ValueError as error:
        result = {"requests_per_s": None, "error": str(error), "raw_tail": (done.stdout + done.stderr)[-1500:]}
    return result | {"command": shlex.join(argv)}


def parse_hey_csv(text: str) -> dict[str, Any]:
    """Answers, answers/s, latency percentiles (ms) and status codes from hey's CSV output."""
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or tuple(header) != CSV_COLUMNS:
        raise ValueError(f"not hey's CSV output: header {header}, expected {','.join(CSV_COLUMNS)}")
    rows = [row for row in reader if row]
    if not rows:
        raise ValueError("hey's CSV has no rows: no request was answered")
    columns = {name: i for i, name in enumerate(CSV_COLUMNS)}
    latency_s = np.array([float(row[columns["response-time"]]) for row in rows])  # (N,)
    offset_s = np.array([float(row[columns["offset"]]) for row in rows])  # (N,)
    span_s = float((offset_s + latency_s).max())  # from the run's start to its last answer
    codes = Counter(row[columns["status-code"]] for row in rows)
    return {
        "requests": len(rows),
        "requests_per_s": round(len(rows) / span_s, 1) if span_s > 0 else None,
        "latency_ms": latency_summary_ms(latency_s),
        "status_codes": dict(sorted(codes.items())),
    }
