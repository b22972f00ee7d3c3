"""app/ops/process_metrics.py: with several workers, /metrics has each live process's process_* series by pid (the
multiprocess mode had none: operators read memory from the container alone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.ops.process_metrics import WorkerProcesses


def test_each_live_process_has_its_memory_and_cpu_by_pid_and_a_process_gone_has_none(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(ended.stdout)
    try:
        for pid, name in ((os.getpid(), "livemin"), (child.pid, "livesum"), (gone, "livemin")):
            (tmp_path / f"gauge_{name}_{pid}.db").write_bytes(b"")
        (tmp_path / "counter_1.db").write_bytes(b"")  # a counter's file says nothing of whether its process lives
        registry = CollectorRegistry()
        registry.register(WorkerProcesses(str(tmp_path)))
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    finally:
        child.communicate(b"")
    memory = {int(s.labels["pid"]): s.value for s in families["process_resident_memory_bytes"].samples}
    assert sorted(memory) == sorted([os.getpid(), child.pid])
    assert all(value > 1_000_000 for value in memory.values())  # a Python process holds megabytes
    cpu = {int(s.labels["pid"]) for s in families["process_cpu_seconds"].samples}
    assert cpu == set(memory) and families["process_cpu_seconds"].type == "counter"
    assert {"process_open_fds", "process_max_fds", "process_start_time_seconds"} <= set(families)


def test_a_folder_gone_yields_no_series(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(WorkerProcesses(str(tmp_path / "removed at the server's end")))
    assert b"process_" not in generate_latest(registry)
