"""What the reliability tests share: the real server on the CPU, and the load generator as a client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SERVE = (sys.executable, "-m", "app.cli", "serve")


def loadtest(out: Path, *args: str, timeout_s: float = 120) -> dict[str, Any]:
    """Run the project's load generator (a real HTTP client, in its own process) and read its record."""
    argv = [sys.executable, "-m", "loadtest", *args, "--out", str(out), "--quiet", "--no-check-labels"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(out.read_text())
    return record
