"""The server with its event loop's thread on a core of its own, away from the front door's C threads (item 4).

    PIN_LOOP=0 PIN_DOOR=1-7 python3 -m bench.pin_threads serve …   # as python3 -m app.cli serve …

Run 53 found a front-door piece's answers taking 0.16 ms of wall time on the event loop, a third or more of it not
the loop's CPU (bench/results/2026-12-06-run53-h100-door-stage-trace.md). One candidate: the door threads that the
answers wake are scheduled on the loop's own core and preempt it. This pins the process's main thread (the event
loop's) to PIN_LOOP's cores and every thread named cgserve-door to PIN_DOOR's, as soon as they exist; the other
threads keep the process's cores. With STAGE_TRACE set, the stages are traced as bench/stage_trace.py traces them.
For the bench alone: sweep.py runs it with --server-module bench.pin_threads.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.2  # how often the process's threads are looked at


def cores(text: str) -> set[int]:
    """'0', '1-7', '0,2-3' → the set of cores."""
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def _threads() -> list[tuple[int, str]]:
    """(thread id, name) of each of this process's threads."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found.append((int(task.name), (task / "comm").read_text().strip()))
        except OSError:  # the thread ended
            continue
    return found


def _keep_pinned(loop_cores: set[int], door_cores: set[int], others: set[int]) -> None:
    """For the process's life: the main thread on loop_cores, the door's on door_cores, and every other thread on
    the process's own cores (a thread inherits its creator's cores: those the main thread starts would share its)."""
    pid, said = os.getpid(), False
    while True:
        doors = 0
        for tid, name in _threads():
            want = loop_cores if tid == pid else door_cores if name == "cgserve-door" else others
            doors += name == "cgserve-door"
            try:
                if os.sched_getaffinity(tid) != want:
                    os.sched_setaffinity(tid, want)
            except OSError:  # the thread ended
                continue
        if doors and not said:
            print(f"pin_threads: the event loop on {sorted(loop_cores)}, {doors} door threads on {sorted(door_cores)}",
                  file=sys.stderr, flush=True)  # fmt: skip
            said = True
        time.sleep(POLL_S)


def main() -> int:
    others = os.sched_getaffinity(0)
    loop_cores, door_cores = cores(os.environ["PIN_LOOP"]), cores(os.environ["PIN_DOOR"])
    threading.Thread(target=_keep_pinned, args=(loop_cores, door_cores, others), name="pin-threads",
                     daemon=True).start()  # fmt: skip
    if os.environ.get("STAGE_TRACE"):  # the stages traced too (bench/stage_trace.py)
        from bench import stage_trace

        stage_trace.install(Path(os.environ["STAGE_TRACE"]))
    from app.cli import main as serve

    return serve(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
