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
import ctypes
import os
import signal
import socket
import time
from functools import partial
from pathlib import Path

import numpy as np
import orjson

from app.codecs.bodies import encode_predictions
from app.config import Settings
from app.repository.model_spec import ModelSpec
from app.service import Service

ROOT = Path(__file__).resolve().parents[2]
MOST_ROWS = 1024  # a bulk's rows at most (the C side refuses 503 past it); more than a batch's: the batcher splits


def load(library: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library))
    lib.fd_open.restype = ctypes.c_void_p
    lib.fd_open.argtypes = [ctypes.c_int] * 6 + [ctypes.c_char_p, ctypes.c_int]
    lib.fd_waiting.restype = ctypes.c_int
    lib.fd_waiting.argtypes = [ctypes.c_void_p]
    lib.fd_buffer.restype = ctypes.c_void_p
    lib.fd_buffer.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fd_take.restype = ctypes.c_int
    lib.fd_take.argtypes = [ctypes.c_void_p] * 4
    lib.fd_release.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fd_answer.restype = None
    lib.fd_answer.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_char_p] * 2
    lib.fd_counts.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fd_close.argtypes = [ctypes.c_void_p]
    return lib


class Answers:
    """encode_predictions' /predict answer for each of k rows, built for the k at once (one orjson call, not
    k): Python's thread answers every request of the process, so its work a row is the design's ceiling."""

    def __init__(self, spec: ModelSpec, engine: str) -> None:
        head = orjson.dumps({"model": spec.name, "engine": engine, "postprocess": spec.config.postprocess})
        self.prefix = head[:-1] + b',"predictions":[{"label":'
        self.names = [b',"class_name":' + orjson.dumps(name) + b',"scores":[' for name in spec.class_names]
        self.spec, self.engine = spec, engine

    def __call__(self, scores: np.ndarray) -> list[bytes]:
        """(k, classes) float32 → k answers, byte for byte encode_predictions' of each row alone."""
        labels = scores.argmax(axis=1).tolist()
        rows = orjson.dumps(scores, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2].split(b"],[")  # b"[[…],[…]]"
        return [
            b"%s%d%s%s]}]}" % (self.prefix, label, self.names[label], row)
            for label, row in zip(labels, rows, strict=True)
        ]

    def check(self) -> None:
        scores = np.random.default_rng(0).random((3, len(self.names)), dtype=np.float32)
        mine = self(scores)
        theirs = [encode_predictions(scores[i : i + 1], model=self.spec.name, engine=self.engine, spec=self.spec)
                  for i in range(3)]  # fmt: skip
        if mine != theirs:
            raise SystemExit(f"the bulk answers differ from encode_predictions': {mine[0]!r} != {theirs[0]!r}")


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
    spec, engine = served.spec, batcher.engines[0].name
    answers = Answers(spec, engine)
    answers.check()
    shape, row_bytes = spec.input_shape, spec.pixels  # (C, H, W) uint8 pixels a request

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen(4096)
    listener.setblocking(False)
    wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    lib = load(args.library)
    loop = asyncio.get_running_loop()
    # Flow control: a bulk is taken only while fewer than in_flight are out, so that rows gather in C meanwhile
    # (Python's work is per batch, not per wake-up); one buffer more than that is always free to fill.
    buffers = settings.in_flight + 1
    full = max(settings.buckets)  # a largest bucket's rows waiting: the C side wakes Python again
    door = lib.fd_open(listener.fileno(), args.threads, row_bytes, MOST_ROWS, buffers, wake, b"/predict", full)
    bulk_bytes = MOST_ROWS * row_bytes
    rows = [  # (MOST_ROWS, C, H, W) each: the C side's buffers, read in place
        np.frombuffer((ctypes.c_uint8 * bulk_bytes).from_address(lib.fd_buffer(door, b)), np.uint8).reshape(
            MOST_ROWS, *shape
        )
        for b in range(buffers)
    ]
    ids = np.empty(MOST_ROWS, np.uint64)
    arrived = np.empty(MOST_ROWS, np.float64)
    which = ctypes.c_int()
    ok, failed, json = b"200 OK", b"500 Internal Server Error", b"application/json"
    out, bulks = [0], [0]
    pieces = [0] * buffers  # a taken bulk's pieces not yet answered
    timer: list[asyncio.TimerHandle | None] = [None]

    def answered(buffer: int, taken: np.ndarray, future: asyncio.Future[np.ndarray]) -> None:
        """One queued piece of a bulk answered (or failed); the bulk's buffer is given back with its last piece."""
        if future.cancelled() or future.exception() is not None:
            bodies = [b'{"error": "the batch failed"}'] * len(taken)
            status = failed
        else:
            bodies, status = answers(future.result()), ok  # (k, classes) scores
        offsets = np.zeros(len(bodies) + 1, np.int64)
        np.cumsum([len(b) for b in bodies], out=offsets[1:])
        joined = b"".join(bodies)
        lib.fd_answer(door, len(taken), taken.ctypes.data, joined, offsets.ctypes.data, status, json)
        pieces[buffer] -= 1
        if pieces[buffer] == 0:
            # Its rows were staged: answered or failed, the batcher is done with them. (Not so for a bulk split
            # over batches whose deadline passed between them, which no measurement's 30 s comes near.)
            lib.fd_release(door, buffer)
            out[0] -= 1
            pump()

    def take() -> None:
        try:
            os.eventfd_read(wake)  # the bulk turned non-empty
        except BlockingIOError:
            return
        pump()

    def pump() -> None:
        """Take bulks while fewer than in_flight are out. --take answered: whatever waits, at once, as one request.
        --take clock: a partial bulk while another is out waits for the batcher's just-in-time moment (its
        DeviceClock: the running batch's expected end less staging), so that it carries what arrives until then,
        and a bulk is queued a largest bucket at a time, each piece answered as its batch is done."""
        while out[0] < settings.in_flight and (waiting := lib.fd_waiting(door)):
            if args.take == "clock" and out[0] and waiting < full:
                delay = batcher.clock.launch_at([0]) - time.monotonic()  # type: ignore[attr-defined]
                if delay > 0:
                    if timer[0] is None:
                        timer[0] = loop.call_later(delay, on_time)
                    return
            k = lib.fd_take(door, ids.ctypes.data, arrived.ctypes.data, ctypes.byref(which))
            if k <= 0:
                return  # k < 0: every buffer is Python's (the flow control leaves one free: not seen)
            out[0] += 1
            bulks[0] += 1
            deadline = time.monotonic() + settings.request_timeout_s
            buffer, taken = which.value, ids[:k].copy()
            piece = full if args.take == "clock" else k  # clock: queued, so answered, a largest bucket at a time
            starts = range(0, k, piece)
            pieces[buffer] = len(starts)
            for start in starts:
                end = min(start + piece, k)
                future = batcher.enqueue(rows[buffer][start:end], deadline)  # read in place until staged
                future.add_done_callback(partial(answered, buffer, taken[start:end]))

    def on_time() -> None:
        timer[0] = None
        pump()

    loop.add_reader(wake, take)
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    print(f"front door on {args.host}:{args.port}: {args.threads} threads, {spec.name} on {args.device}", flush=True)
    started, (main_before, others_before) = time.monotonic(), thread_cpu_s()
    try:
        await stopping.wait()
    finally:
        counts = (ctypes.c_uint64 * 2)()
        lib.fd_counts(door, counts)
        wall, (main, others) = time.monotonic() - started, thread_cpu_s()
        print(
            f"requests {counts[0]} in {bulks[0]} bulks, refused {counts[1]}; cores busy over {wall:.1f} s: "
            f"Python's thread {(main - main_before) / wall:.2f}, the others {(others - others_before) / wall:.2f}",
            flush=True,
        )
        lib.fd_close(door)
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
