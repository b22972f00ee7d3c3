"""The server harness against real processes: ready, failed, hung, and stopped as a group."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from loadtest.server_process import HOST, ServerProcess, free_port, running


def static_server(root: Path, port: int) -> list[str]:
    """Python's own file server: GET /readyz is 200 where `root` holds a file named readyz."""
    return [sys.executable, "-m", "http.server", "--bind", HOST, "--directory", str(root), str(port)]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition: Callable[[], bool], server: ServerProcess) -> None:
    """Poll `condition` while `server` runs; fail with its log if it exits or 30 s pass."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline and server.proc.poll() is None, server.log_tail()
        time.sleep(0.05)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind((HOST, port))


def test_running_yields_a_ready_server_then_stops_it_and_keeps_its_log(tmp_path: Path) -> None:
    (tmp_path / "readyz").write_text("ok")
    port, log = free_port(), tmp_path / "logs" / "server.log"
    with running(static_server(tmp_path, port), log, port=port, ready_timeout_s=30) as server:
        assert server.url == f"http://{HOST}:{port}"
        assert httpx.get(f"{server.url}/readyz", trust_env=False).text == "ok"
    assert server.proc.poll() is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/readyz", trust_env=False)
    assert "GET /readyz" in log.read_text()  # http.server logs each request


def test_a_process_that_exits_before_ready_raises_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('bad setting: buckets'); sys.exit(3)"]
    with (
        pytest.raises(RuntimeError, match=r"exited with 3:\n.*bad setting: buckets"),
        running(argv, tmp_path / "exit.log", port=free_port(), ready_timeout_s=30),
    ):
        pytest.fail("never ready")


def test_a_server_that_never_gets_ready_times_out(tmp_path: Path) -> None:
    port = free_port()  # no readyz file: GET /readyz is 404
    t0 = time.monotonic()
    with (
        pytest.raises(TimeoutError, match="/readyz not 200 within 1 s"),
        running(static_server(tmp_path, port), tmp_path / "hung.log", port=port, ready_timeout_s=1),
    ):
        pytest.fail("never ready")
    assert time.monotonic() - t0 < 20


def test_stop_ends_the_whole_group_children_included(tmp_path: Path) -> None:
    # A parent that starts the real server and waits for it, as `make serve` does.
    pid_file = tmp_path / "child.pid"
    parent = (
        "import subprocess, sys; "
        f"child = subprocess.Popen({static_server(tmp_path, 0)!r}); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); child.wait()"
    )
    server = ServerProcess([sys.executable, "-c", parent], tmp_path / "group.log", port=free_port())
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", server)
    child = int(pid_file.read_text())
    assert alive(child)
    server.stop()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = (
        "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    server = ServerProcess([sys.executable, "-c", stubborn], tmp_path / "stubborn.log", port=free_port())
    wait_until(ready.exists, server)  # SIGTERM before the handler is set would end it the ordinary way
    t0 = time.monotonic()
    assert server.stop(grace_s=0.5) == -9
    assert time.monotonic() - t0 < 10
