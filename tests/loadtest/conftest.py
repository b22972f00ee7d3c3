"""Servers for the load-generator tests: real processes on free local ports, always stopped."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

READY_TIMEOUT_S = 90.0  # model load + engine build on a slow CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command() -> list[str]:
    """The installed console script beside this interpreter, or the module where it is absent."""
    script = Path(sys.executable).with_name("cudagraph-serve")
    if script.exists():
        return [str(script), "serve"]
    if found := shutil.which("cudagraph-serve"):
        return [found, "serve"]
    return [sys.executable, "-m", "app.cli", "serve"]


def start_server(argv: list[str], log: Path) -> Iterator[str]:
    """Run `argv` (it listens on the port given in it) until /readyz answers 200; yield its URL."""
    port = argv[argv.index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            with httpx.Client(base_url=url, timeout=2.0, trust_env=False) as client:
                while True:
                    if proc.poll() is not None:
                        pytest.fail(f"{argv[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                    if time.monotonic() > deadline:
                        pytest.fail(f"{url}/readyz not 200 within {READY_TIMEOUT_S:g} s:\n{log.read_text()[-3000:]}")
                    try:
                        if client.get("/readyz").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
            yield url
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # this server's own session only
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real service on the CPU (eager engine)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    argv = [*serve_command(), "--host", "127.0.0.1", "--port", str(free_port()), "--device", "cpu"]
    yield from start_server(argv, log)


@pytest.fixture(scope="module")
def noop_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("noop") / "noop.log"
    argv = [sys.executable, "-m", "loadtest.servers.noop", "--host", "127.0.0.1", "--port", str(free_port())]
    yield from start_server(argv, log)
