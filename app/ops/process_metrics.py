"""The `process_*` metrics (memory, CPU time, open files, start time) of every live process of a server with several
workers, labelled by pid. prometheus_client's multiprocess mode has no process collector: each worker's registry
would report only the worker that answered the scrape, so the mode drops them all. Here whichever worker renders
/metrics reads /proc for each process whose live gauges are in the metrics folder: the workers, and the engine
process where there is one (each imports app/ops/metrics.py, whose label-less cgserve_ready is a live gauge).

One process serving alone keeps prometheus_client's own, unlabelled collector."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

ENDED = "ZX"  # /proc/<pid>/stat's states of a process that has ended: a zombie, dead
LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")  # prometheus_client's files of a process's live gauges


def live_pids(folder: str) -> list[int]:
    """The processes whose live gauges are in `folder`, the multiprocess metrics folder (a process gone leaves it
    within a second: app/runtime/workers.py's forget_the_gone)."""
    try:
        names = os.listdir(folder)
    except OSError:  # the folder removed at the server's end
        return []
    return sorted({int(match[1]) for name in names if (match := LIVE_GAUGE_FILE.match(name))})


def state_and_parent(pid: int) -> tuple[str, int] | None:
    """/proc/<pid>/stat's state (R, S, Z for a zombie …) and parent pid, or None where there is no such process
    (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[-1].split()  # after the command's name, which may hold spaces
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def is_zombie(pid: int) -> bool:
    """Whether `pid` has ended and waits to be reaped (os.kill(pid, 0) still finds it)."""
    state = state_and_parent(pid)
    return state is not None and state[0] in ENDED


class WorkerProcesses(Collector):
    """process_resident_memory_bytes{pid} and the rest of prometheus_client's process metrics, for each live pid
    that is a child of `parent`: the server's manager, whose workers render /metrics (a pid of the folder reused
    by some other process before the manager's sweep is not the server's)."""

    def __init__(self, folder: str, parent: int | None = None) -> None:
        self.folder = folder
        self.parent = os.getppid() if parent is None else parent

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for pid in live_pids(self.folder):
            state = state_and_parent(pid)
            if state is None or state[0] in ENDED or state[1] != self.parent:  # gone, ended unreaped, or not ours
                continue  # (a zombie's memory and open files read 0: a dip in every panel while a worker drains)
            for family in ProcessCollector(pid=functools.partial(int, pid), registry=None).collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    into.add_sample(sample.name, {"pid": str(pid)}, sample.value)
        return merged.values()
