"""Servers for the load-generator tests: real processes on free loopback ports, always stopped."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.hey import resolve_hey
from loadtest.server_process import HOST, free_port, running

READY_TIMEOUT_S = 90.0  # model load + engine build on a slow CI machine
ROOT = Path(__file__).resolve().parents[2]


def serve(tmp_path_factory: pytest.TempPathFactory, name: str, *argv: str) -> Iterator[str]:
    """`python -m ARGV --host HOST --port PORT` with this interpreter, until the module's tests end."""
    port = free_port()
    argv = (sys.executable, "-m", *argv, "--host", HOST, "--port", str(port))
    log = tmp_path_factory.mktemp(name) / f"{name}.log"
    with running(argv, log, port=port, ready_timeout_s=READY_TIMEOUT_S) as server:
        yield server.url


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real service on the CPU (eager engine)."""
    yield from serve(tmp_path_factory, "server", "app.cli", "serve", "--device", "cpu", "--drain-seconds", "0.1")


@pytest.fixture(scope="module")
def noop_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The no-op ceiling server (loadtest/servers/noop.py)."""
    yield from serve(tmp_path_factory, "noop", "loadtest.servers.noop")


@pytest.fixture(scope="session")
def hey() -> str | None:
    """hey's path ($HEY, .gpu/bin/hey, ../shared/gpu/bin/hey or on PATH), or None."""
    candidates = [os.environ.get("HEY"), ROOT / ".gpu/bin/hey", ROOT.parent / "shared/gpu/bin/hey", "hey"]
    return next((found for c in candidates if c and (found := resolve_hey(str(c)))), None)
