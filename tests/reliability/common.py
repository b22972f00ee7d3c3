"""What the reliability tests share: the real server on the CPU, and the load generator as a client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SERVE = (sys.executable, "-m", "app.cli", "serve")

# As the issue measured it: the server on one core, the clients on the other, where there are two.
_SPLIT = shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2
SERVER_CORE, CLIENT_CORE = sorted(os.sched_getaffinity(0))[:2] if _SPLIT else (None, None)
PINNED_SERVE = ("taskset", "-c", str(SERVER_CORE), *SERVE) if _SPLIT else SERVE


def on_client_core() -> None:
    """Pin the calling thread to the clients' core (a no-op where there is one core)."""
    if CLIENT_CORE is not None:
        os.sched_setaffinity(0, {CLIENT_CORE})


def loadtest(out: Path, *args: str, timeout_s: float = 120) -> dict[str, Any]:
    """Run the project's load generator (a real HTTP client, in its own process) and read its record."""
    argv = [sys.executable, "-m", "loadtest", *args, "--out", str(out), "--quiet", "--no-check-labels"]
    if CLIENT_CORE is not None:
        argv = ["taskset", "-c", str(CLIENT_CORE), *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(out.read_text())
    return record
