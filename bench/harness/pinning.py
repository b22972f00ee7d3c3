"""Which cores the servers and the load generator run on (taskset lists), and why not where not."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any


def parse_cores(text: str) -> list[int]:
    """'0-7,12' → [0, 1, ..., 7, 12] (taskset's list syntax)."""
    cores: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return sorted(cores)


def core_list(cores: list[int]) -> str:
    """[0, 1, 2, 5] → '0-2,5'."""
    parts, start = [], None
    for i, c in enumerate(cores):
        start = c if start is None else start
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            parts.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)


def plan_pinning(server: str, loadgen: str, no_pin: bool) -> dict[str, Any]:
    """Which cores the servers and the generator get, and why pinning is off where it is.

    'auto' splits the cores this process may use in halves: servers low, generator high.
    """
    available = sorted(os.sched_getaffinity(0))
    plan: dict[str, Any] = {"available_cores": core_list(available), "taskset": shutil.which("taskset"), "notes": []}
    if no_pin or len(available) < 2:
        plan["notes"].append("pinning off: --no-pin" if no_pin else "pinning off: fewer than 2 cores")
        return plan | {"server_cores": None, "loadgen_cores": None}
    half = len(available) // 2
    server_cores = available[:half] if server == "auto" else parse_cores(server)
    loadgen_cores = available[half:] if loadgen == "auto" else parse_cores(loadgen)
    missing = sorted(set(server_cores + loadgen_cores) - set(available))
    if missing:
        plan["notes"].append(f"pinning off: cores {core_list(missing)} are not available ({plan['available_cores']})")
        return plan | {"server_cores": None, "loadgen_cores": None}
    if set(server_cores) & set(loadgen_cores):
        raise SystemExit(f"--server-cores and --loadgen-cores overlap: {core_list(server_cores)} / {loadgen}")
    if plan["taskset"] is None:
        plan["notes"].append("taskset not found (util-linux): servers unpinned, generator pinned")
        server_cores = None
    elif (probe := _try_taskset(server_cores)) is not None:
        plan["notes"].append(f"taskset fails here ({probe}): servers unpinned")
        server_cores = None
    return plan | {"server_cores": server_cores, "loadgen_cores": loadgen_cores}


def _try_taskset(cores: list[int]) -> str | None:
    """None where `taskset -c CORES true` works, else why not (some sandboxes refuse affinity)."""
    try:
        done = subprocess.run(["taskset", "-c", core_list(cores), "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit code {done.returncode}")


def pin_generator(pin: dict[str, Any]) -> None:
    """Pin this process (and so the generator processes and hey it starts) to the plan's generator
    cores; where the sandbox refuses, a note in the plan and the generator unpinned."""
    if not pin["loadgen_cores"]:
        return
    try:
        os.sched_setaffinity(0, pin["loadgen_cores"])
    except OSError as error:
        pin["notes"].append(f"load generator unpinned: sched_setaffinity failed ({error})")
        pin["loadgen_cores"] = None
