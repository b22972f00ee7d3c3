"""The load generator's command line run as a child process, for the bench scripts: its record, or
its summary.

A process of its own, so that a script measuring a server never shares its interpreter with the
generator; pinned with taskset to `cores` where given (and where taskset exists).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_loadtest(url: str, out: Path, *args: str, cores: str | None = None, timeout_s: float = 600) -> dict[str, Any]:
    """`python -m loadtest --url URL --out OUT ARGS…`; its JSON record. CalledProcessError (with the
    generator's stderr) where it fails."""
    argv = [sys.executable, "-m", "loadtest", "--url", url, "--quiet", "--out", str(out), *args]
    if cores and shutil.which("taskset"):
        argv = ["taskset", "-c", cores, *argv]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout_s)
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def load_summary(url: str, out: Path, *args: str, cores: str | None = None, timeout_s: float = 240) -> dict[str, Any]:
    """The figures a bench table quotes from one run; {"error": stderr's tail} where it failed."""
    try:
        record = run_loadtest(url, out, *args, cores=cores, timeout_s=timeout_s)
    except subprocess.CalledProcessError as error:
        return {"error": (error.stderr or "")[-1500:]}
    return {
        "throughput_rps": record["throughput_rps"],
        "images_per_s": record["images_per_s"],
        "latency_ms": {q: record["latency_ms"][q] for q in ("p50", "p90", "p99")},
        "errors": record["errors"],
        "loadgen_cpu_busy": record["loadgen_cpu_busy"],
        "loadgen_lag_ms": record["loadgen_lag_ms"],
        "tail_over_time": record["tail_over_time"],
        "window_start_monotonic_s": record["window_start_monotonic_s"],
        "args": list(args),
    }
