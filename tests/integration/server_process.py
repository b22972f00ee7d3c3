"""Starting the real server as README says (`make serve`), on a free loopback port, and stopping it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


README_COMMAND = ("make", "--no-print-directory", "serve")


@contextmanager
def running_server(log_path: Path, command: tuple[str, ...] = README_COMMAND, **settings: str) -> Iterator[str]:
    """Run `command` (README's by default) with CGSERVE_* settings; yield its URL once /readyz answers 200."""
    port = free_port()
    env = {**os.environ, "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port)}
    env.update({f"CGSERVE_{name.upper()}": value for name, value in settings.items()})
    with log_path.open("wb") as log:
        # A session of its own, so that stopping it stops make and the server it started.
        process = subprocess.Popen(
            list(command), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, process, log_path)
            yield url
        except BaseException:
            sys.stderr.write(f"--- server log ({log_path}), last 4000 characters ---\n{log_path.read_text()[-4000:]}\n")
            raise
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except ProcessLookupError:  # it had exited already
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the server was not ready within {START_TIMEOUT_S} s:\n{log_path.read_text()}")
