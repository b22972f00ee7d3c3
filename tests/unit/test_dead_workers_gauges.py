"""The worker manager's look at the metrics folder (app/runtime/workers.py's forget_the_gone): the live gauges of
every process gone leave /metrics, whether or not it was ever one of uvicorn's workers (a replacement uvicorn gave
up on during a SIGHUP restart had made its files and kept cgserve_ready at 0: a review)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtime.workers import DrainingManager


def gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(ended.stdout)


def test_the_live_gauges_of_a_process_gone_are_removed_and_the_living_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead, alive = gone_pid(), os.getpid()
    names = [f"gauge_livemin_{dead}.db", f"gauge_livesum_{dead}.db", f"gauge_livemin_{alive}.db",
             f"counter_{dead}.db", f"gauge_max_{dead}.db"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    DrainingManager.forget_the_gone(object.__new__(DrainingManager))
    # Its counters and max gauges stay: they count what it did (prometheus_client's mark_process_dead keeps them).
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"gauge_livemin_{alive}.db", f"counter_{dead}.db", f"gauge_max_{dead}.db"]
    )


def test_a_pid_another_user_now_holds_is_alive_and_the_sweep_goes_on_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.kill(pid, 0) answers EPERM for a dead worker's pid reused by another user's process: that ended the whole
    sweep, and every dead pid after it kept its gauges (a review)."""
    import app.runtime.workers as workers

    dead = [gone_pid() for _ in range(3)]
    reused, kill = dead[0], os.kill

    def kill_as_another_user_sees_it(pid: int, sig: int) -> None:
        if pid == reused:
            raise PermissionError(1, "Operation not permitted")
        kill(pid, sig)

    monkeypatch.setattr(workers.os, "kill", kill_as_another_user_sees_it)
    for pid in dead:
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    DrainingManager.forget_the_gone(object.__new__(DrainingManager))
    assert [p.name for p in tmp_path.iterdir()] == [f"gauge_livesum_{reused}.db"]  # its owner is alive


def test_a_worker_that_died_unreaped_while_draining_leaves_its_live_gauges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the server drains, the manager reaps no worker: one that died stayed a zombie, which os.kill(pid, 0)
    finds, and its live gauges stayed until the server ended (a review)."""
    import time

    from app.ops.process_metrics import is_zombie

    zombie = subprocess.Popen([sys.executable, "-c", ""])
    try:
        while not is_zombie(zombie.pid):
            time.sleep(0.01)
        (tmp_path / f"gauge_livemin_{zombie.pid}.db").write_bytes(b"")
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        DrainingManager.forget_the_gone(object.__new__(DrainingManager))
        assert list(tmp_path.iterdir()) == []
    finally:
        zombie.wait()
