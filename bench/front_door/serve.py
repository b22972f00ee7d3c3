"""A prototype server: HTTP in C threads (front_door.c), batching and the GPU in Python, one process.

    cc -O2 -shared -fPIC -pthread -o /tmp/libfrontdoor.so bench/front_door/front_door.c
    PYTHONPATH=. python3 -m bench.front_door.serve --library /tmp/libfrontdoor.so --port 8000 --threads 8

What issue 26's items 4 and 5 ask of the seed CNN (≥ 0.8× and ≥ 0.7× a raw ASGI no-op on uvicorn)
needs a request's whole path far cheaper than Python makes it (run 33b: the no-op answers in 0.28 ms at
64 connections, ours in 1.2–1.8). This measures the design that would: `--threads` C threads parse
POST /predict with raw pixels and copy them into a bulk; Python's event loop takes a bulk (read in place
in the C side's buffer) only while fewer than in_flight are out, so that rows gather while the GPU works,
queues it on the model's real batcher (the service's own engines and CUDA graphs, one context) as ONE
request of k images, and hands the k answers (byte for byte the service's /predict JSON) back to the C
threads, which write them. Python's work is per bulk, not per request. Everything else gets a refusal:
this measures the design, it is not a server (no timeouts, connection caps, tokens or metrics).
Measured in run 34: bench/results/2026-12-03-run34-h200-front-door.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import time
from functools import partial
from pathlib import Path

import numpy as np

from app.batching.batcher import Batcher
from app.config import Settings
from app.service import Service
from bench.front_door.answers import Answers
from bench.front_door.door import Door

ROOT = Path(__file__).resolve().parents[2]
JSON, OK, FAILED = b"application/json", b"200 OK", b"500 Internal Server Error"


class Feeder:
    """Bulks from the door to the batcher, and their answers back: Python's whole share of the work."""

    def __init__(self, door: Door, batcher: Batcher, answers: Answers, settings: Settings, take: str) -> None:
        self.door, self.batcher, self.answers, self.take = door, batcher, answers, take
        self.in_flight, self.timeout_s = settings.in_flight, settings.request_timeout_s
        self.full = max(settings.buckets)  # a largest bucket's rows
        self.out = 0  # bulks taken and not yet wholly answered
        self.bulks = 0
        self.pieces: dict[int, int] = {}  # a taken bulk's buffer → its pieces not yet answered
        self.timer: asyncio.TimerHandle | None = None

    def pump(self) -> None:
        """Take bulks while fewer than in_flight are out, so that rows gather in C while the GPU works (taken at
        every wake-up, bulks held a few rows each: run 34b). --take answered: whatever waits, at once, as one
        request. --take clock: a partial bulk while another is out waits for the batcher's just-in-time moment
        (its DeviceClock: the running batch's expected end less staging), so that it carries what arrives until
        then, and a bulk is queued a largest bucket at a time, each piece answered as its batch is done."""
        while self.out < self.in_flight and (waiting := self.door.waiting()):
            if self.take == "clock" and self.out and waiting < self.full:
                delay = self.batcher.clock.launch_at([0]) - time.monotonic()
                if delay > 0:
                    if self.timer is None:
                        self.timer = asyncio.get_running_loop().call_later(delay, self._on_time)
                    return
            taken = self.door.take()
            if taken is None:
                return
            buffer, rows, ids = taken
            self.out += 1
            self.bulks += 1
            deadline = time.monotonic() + self.timeout_s
            piece = self.full if self.take == "clock" else len(rows)
            starts = range(0, len(rows), piece)
            self.pieces[buffer] = len(starts)
            for start in starts:
                future = self.batcher.enqueue(rows[start : start + piece], deadline)  # read in place until staged
                future.add_done_callback(partial(self._answered, buffer, ids[start : start + piece]))

    def _answered(self, buffer: int, ids: np.ndarray, future: asyncio.Future[np.ndarray]) -> None:
        """One queued piece of a bulk answered (or failed); the bulk's buffer is given back with its last piece."""
        if future.cancelled() or future.exception() is not None:
            self.door.answer(ids, [b'{"error": "the batch failed"}'] * len(ids), FAILED, JSON)
        else:
            self.door.answer(ids, self.answers(future.result()), OK, JSON)  # (k, classes) scores
        self.pieces[buffer] -= 1
        if self.pieces[buffer] == 0:
            # Its rows were staged: answered or failed, the batcher is done with them. (Not so for a bulk split
            # over batches whose deadline passed between them, which no measurement's 30 s comes near.)
            self.door.release(buffer)
            self.out -= 1
            self.pump()

    def _on_time(self) -> None:
        self.timer = None
        self.pump()


def thread_cpu_s() -> tuple[float, float]:
    """(this process's main thread, all its other threads) CPU seconds, from /proc."""
    tick, main, others = os.sysconf("SC_CLK_TCK"), 0.0, 0.0
    for task in os.listdir("/proc/self/task"):
        fields = Path(f"/proc/self/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        main, others = (main + seconds, others) if int(task) == os.getpid() else (main, others + seconds)
    return main, others


async def serve(args: argparse.Namespace) -> None:
    settings = Settings(
        host=args.host, port=args.port, grpc_port=0, device=args.device, compile="none",
        model_repository=args.repository, log_level="warning",
    )  # fmt: skip
    service = Service(settings)
    service.start()
    await service.wait_started()
    served = service.model(None)
    batcher = served.ready_batcher()
    assert isinstance(batcher, Batcher), "the engines in this process (no engine process)"
    answers = Answers(served.spec, batcher.engines[0].name)
    answers.check()

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen(4096)
    listener.setblocking(False)
    wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    # One buffer more than the bulks Python may hold: there is always one to fill.
    door = Door(args.library, listener, threads=args.threads, shape=served.spec.input_shape, wake_fd=wake,
                buffers=settings.in_flight + 1, path=b"/predict", full_rows=max(settings.buckets))  # fmt: skip
    feeder = Feeder(door, batcher, answers, settings, args.take)

    def woken() -> None:  # a bulk turned non-empty, or reached a largest bucket
        try:
            os.eventfd_read(wake)
        except BlockingIOError:
            return
        feeder.pump()

    loop = asyncio.get_running_loop()
    loop.add_reader(wake, woken)
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    where = f"{args.host}:{args.port}: {args.threads} threads, {served.spec.name} on {args.device}"
    print(f"front door on {where}", flush=True)
    started, (main_before, others_before) = time.monotonic(), thread_cpu_s()
    try:
        await stopping.wait()
    finally:
        (requests, refused), bulks = door.counts(), feeder.bulks
        wall, (main, others) = time.monotonic() - started, thread_cpu_s()
        print(
            f"requests {requests} in {bulks} bulks, refused {refused}; cores busy over {wall:.1f} s: "
            f"Python's thread {(main - main_before) / wall:.2f}, the others {(others - others_before) / wall:.2f}",
            flush=True,
        )
        door.close()
        await service.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--library", type=Path, required=True, help="front_door.c built as a shared library")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, default=8, help="C threads serving HTTP")
    p.add_argument("--device", default="cuda")
    p.add_argument("--repository", type=Path, default=ROOT / "models" / "repository")
    p.add_argument(
        "--take",
        choices=("answered", "clock"),
        default="answered",
        help="when a bulk is taken, and in what pieces (pump)",
    )
    args = p.parse_args()
    import uvloop

    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
