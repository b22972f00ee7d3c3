"""A batch of one-image requests staged beside a thread running Python: numpy's copies against held ones.

    PYTHONPATH=. python3 bench/gil_convoy.py --out bench/results/2026-12-05-cpu-gil-convoy.json

The batcher stages a batch a request's rows at a time (app/batching/shares.py's stage), and the GPU JPEG decoder
hands a batch back a photo at a time: 128 copies of a 150 KB row (3×224×224 uint8) for a full ResNet-50 batch of
one-image requests. numpy gives the GIL up for each copy and must win it back; while another thread runs Python,
that waits out the switch interval (the server sets 1 ms). This times `stage` as it was (numpy's slice
assignment, `numpy`) and as it is (app/ops/held_copy.py, `held`), alone and beside one thread that runs Python
without pause (the event loop, for a staging thread; a staging or launch thread's Python, for the loop), each
--repeats times, and writes the medians and every figure.

It also times the front door's calls from the event loop, four a bulk (fd_waiting, fd_take, fd_release, fd_answer),
alone and beside the same thread, bound as app/front_door/door.py binds them (all four through ctypes' CDLL, which
gives the GIL up for a call), with the two that never wait on the door's threads (waiting, release) through PyDLL,
which keeps it, and all four through PyDLL. The call timed is door.c's fd_refusal_code, which does nothing: what is
left is winning the GIL back, so the real calls, which give it up for longer, cost CDLL at least this.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from app.batching.shares import PendingRequest, Share, stage
from app.front_door.library import door_library

ROWS, SHAPE, SWITCH_INTERVAL_S = 128, (3, 224, 224), 0.001


def numpy_stage(shares: list[Share], staging: np.ndarray) -> None:
    """`stage`'s uint8 path before app/ops/held_copy.py: numpy's slice assignment, a request at a time."""
    offset = 0
    for request, start, end in shares:
        staging[offset : offset + end - start] = request.images[start:end]
        offset += end - start


def timed_ms(fn: Any, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append(round((time.perf_counter() - started) * 1e3, 3))
    return out


# A bulk's calls in the order the loop makes them: fd_waiting, fd_take, fd_release, fd_answer; True: through PyDLL.
DOOR_PUMPS = {"all CDLL (door.py)": (False,) * 4, "waiting and release PyDLL": (True, False, True, False),
              "all PyDLL": (True,) * 4}  # fmt: skip


def door_calls(beside_python: bool, pumps: int = 2000) -> dict[str, Any]:
    """A bulk's four door calls, `pumps` times, bound each way of DOOR_PUMPS: mean ms a pump, pumps past 0.5 ms."""
    path = str(door_library(None))  # builds door.c (cc, nghttp2's headers) if it is not built yet
    calls = {}
    for held, lib in ((False, ctypes.CDLL(path)), (True, ctypes.PyDLL(path))):
        calls[held] = call = lib.fd_refusal_code
        call.restype, call.argtypes = ctypes.c_int, [ctypes.c_int]
    out: dict[str, Any] = {}
    stop = threading.Event()

    def python_thread() -> None:
        while not stop.is_set():
            pass

    beside = threading.Thread(target=python_thread, daemon=True)
    if beside_python:
        beside.start()
        time.sleep(0.05)
    for name, bindings in DOOR_PUMPS.items():
        pump = [calls[held] for held in bindings]
        ms = []
        for _ in range(pumps):
            started = time.perf_counter()
            for i, call in enumerate(pump):
                call(i)
            ms.append((time.perf_counter() - started) * 1e3)
        out[name] = {"mean_ms": round(statistics.mean(ms), 4), "max_ms": round(max(ms), 3),
                     "pumps_past_0.5_ms": sum(m > 0.5 for m in ms), "pumps": pumps}  # fmt: skip
    stop.set()
    if beside_python:
        beside.join()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    rng = np.random.default_rng(0)
    # 128 requests of one image each, as the front door queues JPEG uploads once decoded: (1, C, H, W) uint8 rows.
    loop = asyncio.new_event_loop()  # the requests' futures (never awaited: staging does not touch them)
    images = rng.integers(0, 256, (ROWS, 1, *SHAPE), dtype=np.uint8)
    requests = [PendingRequest(row, np.empty((1, 10), np.float32), loop.create_future(), 0.0, 0.0) for row in images]
    shares: list[Share] = [(request, 0, 1) for request in requests]
    slot = SimpleNamespace(inputs={"uint8": np.zeros((ROWS, *SHAPE), np.uint8)})
    expected = np.concatenate([request.images for request in requests])
    ways = {"numpy": lambda: numpy_stage(shares, slot.inputs["uint8"]), "held": lambda: stage(shares, slot)}
    for way in ways.values():  # both write the same rows
        slot.inputs["uint8"][:] = 0
        way()
        assert np.array_equal(slot.inputs["uint8"], expected)

    record: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "rows": ROWS, "row_shape": SHAPE,
                              "switch_interval_ms": SWITCH_INTERVAL_S * 1e3, "ms": {}}  # fmt: skip
    for name, way in ways.items():
        record["ms"][f"{name} alone"] = timed_ms(way, args.repeats)
    stop = threading.Event()
    spins = [0]

    def python_thread() -> None:
        while not stop.is_set():
            spins[0] += 1

    beside = threading.Thread(target=python_thread, daemon=True)
    beside.start()
    time.sleep(0.05)
    for name, way in ways.items():
        before, started = spins[0], time.perf_counter()
        record["ms"][f"{name} beside Python"] = timed_ms(way, args.repeats)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        record[f"other thread's loops a ms, {name}"] = round((spins[0] - before) / elapsed_ms)
    stop.set()
    beside.join()
    record["median_ms"] = {key: statistics.median(values) for key, values in record["ms"].items()}
    loop.close()
    record["door_calls"] = {"alone": door_calls(False), "beside Python": door_calls(True)}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for key, value in record["median_ms"].items():
        print(f"{key:>22}: {value:8.2f} ms (median of {args.repeats})")
    for where, ways in record["door_calls"].items():
        for name, figures in ways.items():
            print(f"door calls {where}, {name}: {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
