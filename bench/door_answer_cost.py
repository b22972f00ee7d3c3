"""What one piece's answers cost the event loop in door.py's Door.answer, on this machine: the call with 21 live
connections waiting (door.c alone, this script playing the feeder), and the offsets it builds for them, with
np.fromiter (door.py's) against the np.cumsum over a list it replaced. Run 53 (item 4) traced 0.16 ms of the loop's
wall time per piece answered; this says how much of it the hand-over itself can be.

    PYTHONPATH=. python3 bench/door_answer_cost.py --out bench/results/<date>-cpu-door-answer-cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import time
import timeit
from pathlib import Path

import numpy as np

from app.front_door.door import Door, Limits, _offsets
from app.front_door.library import door_library

POST = b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\ncontent-length: 784\r\n\r\n"
BODY = b'{"model":"fashion-cnn","engine":"cpu","predictions":[{"label":3,"class_name":"Dress","scores":[' + (
    b"0.1," * 9 + b"0.1]}]}"
)
HEAD = b"content-type: application/json\r\n"


def cumsum_offsets(parts: list[bytes]) -> np.ndarray:
    """door.py's offsets before 64042b3."""
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(part) for part in parts], out=offsets[1:])
    return offsets


def answer_times(k: int, rounds: int) -> list[float]:
    """Seconds of each Door.answer call for `k` live connections, one call a round."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    limits = Limits(max_connections=256, keepalive_s=5, request_s=5, tokens=(), max_bytes=2**24, max_pixels=2**20)
    door = Door(door_library(None), listener, threads=8, shape=(1, 28, 28), buffers=3, wake_fd=wake,
                path=b"/predict", full_rows=128, limits=limits)  # fmt: skip
    connections = [socket.create_connection(listener.getsockname()) for _ in range(k)]
    times = []
    try:
        for _ in range(rounds):
            for connection in connections:
                connection.sendall(POST + bytes(784))
            ids: list[np.ndarray] = []
            latest = time.monotonic() + 5
            while sum(map(len, ids)) < k and time.monotonic() < latest:
                bulk = door.take()
                if bulk is None:
                    time.sleep(0.0002)
                    continue
                ids.append(bulk.ids)
                door.release(bulk.buffer)
            started = time.perf_counter()
            door.answer(np.concatenate(ids), [BODY] * k, b"200 OK", [HEAD] * k)
            times.append(time.perf_counter() - started)
            for connection in connections:  # every answer read before the next round
                data = b""
                while not data.endswith(b"]}]}"):
                    data += connection.recv(4096)
    finally:
        for connection in connections:
            connection.close()
        door.close()
        listener.close()
        os.close(wake)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=21, help="a piece's rows (run 53d's bulks: 21)")
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    bodies, heads = [BODY] * args.rows, [HEAD] * args.rows
    assert (_offsets(bodies) == cumsum_offsets(bodies)).all()
    n = 20000
    offsets = {
        name: timeit.timeit(lambda f=f: (f(bodies), f(heads)), number=n) / n * 1e6  # type: ignore[misc]
        for name, f in (("fromiter", _offsets), ("cumsum", cumsum_offsets))
    }
    joins = timeit.timeit(lambda: (b"".join(bodies), b"".join(heads)), number=n) / n * 1e6
    times = np.array(answer_times(args.rows, args.rounds)) * 1e6
    record = {
        "command": f"PYTHONPATH=. python3 bench/door_answer_cost.py --rows {args.rows} --rounds {args.rounds}",
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor(), "python": platform.python_version()},
        "rows": args.rows,
        "answer_call_us": {
            "median": round(float(np.median(times)), 1),
            "mean": round(float(times.mean()), 1),
            "p90": round(float(np.percentile(times, 90)), 1),
        },
        "offsets_both_us": {name: round(us, 2) for name, us in offsets.items()},
        "joins_both_us": round(joins, 2),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
