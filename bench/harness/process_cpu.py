"""CPU seconds of a server's process tree, by role, from /proc: which process a load saturates.

A point's figure is each process's CPU seconds over the point's wall time (1.0: one core busy
the whole point). The process that maps libcuda is the one driving the GPU (the engine process,
or a worker where each has its own engine); the root is the supervisor.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


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
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "gone"
    return "gpu" if "/libcuda.so" in maps else "worker"  # the driver, mapped at CUDA init (not libcudart)


class TreeCpu:
    """Start before a point, `.stop()` after it: each role's cores busy over the point."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.started = time.monotonic()
        self.before = {pid: cpu_seconds(pid) for pid in tree(root)}

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.started
        busy: dict[str, list[float]] = {}
        for pid, before in self.before.items():
            after = cpu_seconds(pid)
            if before is not None and after is not None:
                busy.setdefault(role(pid, self.root), []).append(round((after - before) / wall, 3))
        return {"wall_s": round(wall, 2), "cores_busy": {k: sorted(v, reverse=True) for k, v in busy.items()}}
