"""CPU of a server's process tree, by role, from /proc: which process a load saturates.

Sampled every SAMPLE_S on a thread from start to `stop()`: each process's cores busy over the
whole point (its CPU seconds ÷ the wall time, load-tool start-up and teardown included: an
under-estimate of the load's share) and over the busiest WINDOW_S of it (`peak`: the figure to
judge saturation by; 1.0 is one core busy throughout). Roles: the engine process (named
cgserve-engines, app/engine_process/host.py), the workers (each with its own engines where there
is no engine process), and the supervisor (the root).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.25
WINDOW_S = 2.0


def tree(root: int) -> list[int]:
    """`root` and every descendant alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def role(pid: int, root: int) -> str:
    if pid == root:
        return "supervisor"
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    return "engine-process" if name == "cgserve-engines" else "worker"


def peak_rate(samples: list[tuple[float, float]]) -> float:
    """The highest CPU rate over any WINDOW_S (or the whole span, if shorter) of (time, cpu seconds)."""
    best, j = 0.0, 0
    for i, (t0, c0) in enumerate(samples):
        while j < len(samples) - 1 and samples[j][0] - t0 < WINDOW_S:
            j += 1
        t1, c1 = samples[j]
        if t1 > t0 and (t1 - t0 >= WINDOW_S or i == 0):
            best = max(best, (c1 - c0) / (t1 - t0))
    return best


class TreeCpu:
    """Start before a point, `.stop()` after it: each role's cores busy, over the point and at its peak."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids = tree(root)
        self.samples: dict[int, list[tuple[float, float]]] = {pid: [] for pid in self.pids}
        self._done = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        now = time.monotonic()
        for pid in self.pids:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                self.samples[pid].append((now, seconds))

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self._sample()

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self._thread.join()
        self._sample()
        mean: dict[str, list[float]] = {}
        peak: dict[str, list[float]] = {}
        wall = 0.0
        for pid, samples in self.samples.items():
            if len(samples) < 2:
                continue
            (t0, c0), (t1, c1) = samples[0], samples[-1]
            wall = max(wall, t1 - t0)
            name = role(pid, self.root)
            mean.setdefault(name, []).append(round((c1 - c0) / (t1 - t0), 3))
            peak.setdefault(name, []).append(round(peak_rate(samples), 3))
        return {
            "wall_s": round(wall, 2),
            "cores_busy": {k: sorted(v, reverse=True) for k, v in mean.items()},
            f"cores_busy_peak_{WINDOW_S:g}s": {k: sorted(v, reverse=True) for k, v in peak.items()},
        }
