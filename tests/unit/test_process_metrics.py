"""app/ops/process_metrics.py: with several workers, /metrics has each live process's process_* series by pid (the
multiprocess mode had none: operators read memory from the container alone)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from app.ops.process_metrics import WorkerProcesses, is_zombie

NEVER_A_PID = 2**22 + 1  # over Linux's largest pid_max: no process has it, now or later


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    """A child of this process (as workers are the manager's), up and running: it has said so."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    yield child
    child.communicate(b"")


def scrape(folder: Path) -> dict[str, Metric]:
    registry = CollectorRegistry()
    registry.register(WorkerProcesses(str(folder), parent=os.getpid()))  # the children of this process are workers
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_each_live_worker_has_its_memory_and_cpu_by_pid(tmp_path: Path, worker: subprocess.Popen[bytes]) -> None:
    zombie = subprocess.Popen([sys.executable, "-c", ""])  # ended and not yet reaped: a worker died while draining
    while not is_zombie(zombie.pid):
        time.sleep(0.01)
    try:
        pids = {"worker": worker.pid, "zombie": zombie.pid, "gone": NEVER_A_PID, "not ours": os.getpid()}
        for pid in pids.values():
            (tmp_path / f"gauge_livemin_{pid}.db").write_bytes(b"")
        (tmp_path / "counter_1.db").write_bytes(b"")  # a counter's file says nothing of whether its process lives
        families = scrape(tmp_path)
    finally:
        zombie.wait()
    memory = {int(s.labels["pid"]): s.value for s in families["process_resident_memory_bytes"].samples}
    assert list(memory) == [worker.pid] and memory[worker.pid] > 1_000_000  # a Python process holds megabytes
    cpu = families["process_cpu_seconds"]
    assert cpu.type == "counter" and [s.labels["pid"] for s in cpu.samples] == [str(worker.pid)]
    assert {"process_open_fds", "process_max_fds", "process_start_time_seconds"} <= set(families)


def test_a_folder_gone_yields_no_series(tmp_path: Path) -> None:
    assert not [name for name in scrape(tmp_path / "removed at the server's end") if name.startswith("process_")]
