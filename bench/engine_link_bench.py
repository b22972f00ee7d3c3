"""The engine process's cost a request, with nothing else in it: the link and the host alone (issue 26).

With CGSERVE_ENGINE_PROCESS one event loop (the engine process) serves every HTTP worker, so its
CPU time a request caps the service's requests a second, however fast the GPU. Here the real
link (app/engine_process/client.py, in this process, as a worker holds it) talks over a real Unix
socket to the real host code (app/engine_process/host.py's WorkerConnection, in a child process)
whose model is a stand-in batcher: it copies each request's rows into a staging array as the
real batcher does (ResNet-50's 150 KB a row) and answers everything queued every --tick-ms, as a
GPU finishing a batch would. No HTTP, no torch: what is measured is the design.

    host_us_per_request    the child's CPU time ÷ requests answered: the engine process's ceiling
    link_us_per_request    this process's (the worker's side of the link, and the clients)
    requests_per_s         closed loop, --concurrency requests in flight

--flows jpeg sends each request as a worker sends a JPEG upload when the engine process owns the
GPU's decoder: its encoded bytes (a 500×375 photo, quality 90) in an UPLOADS frame to the host's
decoder, which a stand-in plays (batches every --tick-ms like the batcher; per upload it copies
the bytes as nvJPEG's input unless handed a writable buffer and hands back a view of its pixels,
as the real one hands a row of its pinned block), and the host enqueues the pixels and answers the
scores; a tree from before UPLOADS (`--tree`) decodes in a DECODE frame and sends the pixels back
as any request's rows in an INFER frame. The engine process's cost an upload, without the GPU.

--tree runs both sides from a copy of the repository (the code before a change), so before and
after are measured on one machine in one run (`git archive <commit> | tar -x -C DIR`).

    PYTHONPATH=. python3 bench/engine_link_bench.py --out bench/results/<name>.json [--tree DIR --label before]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

SHAPE = (3, 224, 224)  # ResNet-50's input, uint8: 150,528 bytes an image
CLASSES = 10
TICKS = os.sysconf("SC_CLK_TCK")


class StandInBatcher:
    """What the host asks of a batcher, answering every tick_s all that was enqueued since the last."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s, self.queued_rows, self.rows_per_s = tick_s, 0, 0.0
        self.dead: str | None = None
        self.staging = np.empty((128, *SHAPE), np.uint8)  # the slot's pinned input, (max_bucket, C, H, W)
        self.waiting: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = []

    def admit(self, deadline: float) -> None:
        pass

    def enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.waiting.append((images, future))
        return future

    async def submit(self, images: np.ndarray, deadline: float | None = None) -> np.ndarray:  # the code before
        return await self.enqueue(images, deadline)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            batch, self.waiting = self.waiting, []
            row = 0
            for images, future in batch:  # staged as the real batcher stages: one copy a row
                k = len(images)
                self.staging[row % 128 : row % 128 + k] = images[: 128 - row % 128]
                row += k
                if not future.done():
                    future.set_result(np.zeros((k, CLASSES), np.float32))


class StandInDecoder:
    """The GPU JPEG decoder as the host sees it (app/codecs/uploads.py's JpegBatchDecoder): uploads
    queue, and every tick_s all of them are "decoded" together. Per upload the copies the real one
    makes on the host: its bytes into a writable buffer (torch.frombuffer's input) and the pixels
    out of the pinned block into a new array."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.pixels = np.random.default_rng(1).integers(0, 256, (1, *SHAPE), dtype=np.uint8)
        self.waiting: list[tuple[Any, np.ndarray | None, asyncio.Future[np.ndarray]]] = []

    def decode(self, data: Any, spec: Any, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        """A future, as the real decoder answers (a host from before awaits it in a task of its own)."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.waiting.append((data, out, future))
        return future

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            batch, self.waiting = self.waiting, []
            for data, out, future in batch:
                if not (isinstance(data, memoryview) and not data.readonly):  # as gpu_jpeg's _writable
                    bytearray(data)
                if future.done():
                    continue
                if out is not None:  # the DECODE frame's: written into the worker's segment
                    np.copyto(out, self.pixels)
                    future.set_result(out)
                else:  # the UPLOADS frame's: a view of the pinned block, as the real decoder hands back its rows
                    future.set_result(self.pixels)

    def close(self) -> None:
        pass


class StandInModel(SimpleNamespace):
    """A served model's stand-in, hashable by identity as ServedModel is (the host keys its ids by it)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


async def host(socket_path: str, tick_s: float) -> None:
    """The child: the real WorkerConnection on a Service that holds one stand-in model."""
    from app.engine_process import host as engine_host

    batcher = StandInBatcher(tick_s)
    served = StandInModel(batcher=batcher, engines=[SimpleNamespace(name="stand-in", device="cpu")],
                          spec=SimpleNamespace(name="m", input_shape=SHAPE, outputs=None, to_wire=dict),
                             ready_batcher=lambda: batcher, options=SimpleNamespace(devices=("cpu",)),
                             retired=False)  # fmt: skip

    async def started() -> None:
        pass

    settings = SimpleNamespace(queue_limit=10**9, model_control="none", model_repository=Path("."))
    decoder = StandInDecoder(tick_s)
    service = SimpleNamespace(models={"m": served}, versions={"m": {"1": served}}, failure=None, on_install=[],
                              wait_started=started, jpeg_decoder=decoder, settings=settings)  # fmt: skip
    # Since model control, a connection belongs to the engine process's host (its table of served models).
    owner = engine_host.EngineHost(service) if hasattr(engine_host, "EngineHost") else service
    tickers = [asyncio.create_task(batcher.run()), asyncio.create_task(decoder.run())]

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine_host.WorkerConnection(owner, reader, writer).run()

    server = await asyncio.start_unix_server(connected, path=socket_path)
    print("listening", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for ticker in tickers:
            ticker.cancel()
        server.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def drive(socket_path: str, segments: str, concurrency: int, seconds: float, host_pid: int, flow: str
                ) -> dict[str, Any]:  # fmt: skip
    from app.engine_process import client as engine_client
    from loadtest.photos import encode, synthetic_photo

    EngineLink, EngineUploads = engine_client.EngineLink, getattr(engine_client, "EngineUploads", None)

    async def no_fallback() -> np.ndarray:
        raise AssertionError("the stand-in decoder refuses nothing")

    link = EngineLink(socket_path, segments, on_dead=lambda why: None)
    await link.connect(timeout_s=30)
    image = np.random.default_rng(0).integers(0, 256, (1, *SHAPE), dtype=np.uint8)
    table = getattr(link, "table", None)  # the served model's id; before model control, its index 0
    model = int(table["m"]["1"]["id"]) if table else 0
    photo = encode(synthetic_photo(500, 375), quality=90)
    answered = 0

    async def client(until: float) -> None:
        nonlocal answered
        while time.monotonic() < until:
            if flow == "jpeg" and EngineUploads is not None:  # in an UPLOADS frame: decoded and inferred there
                await link.send(model, EngineUploads(link, [photo], no_fallback), float("inf"))
            elif flow == "jpeg":  # the code before: a DECODE frame, then its pixels as any request's rows
                pixels = await link.decode(model, photo, image.nbytes)
                await link.send(model, pixels, float("inf"))
            else:
                await link.send(model, image, float("inf"))
            answered += 1

    await asyncio.gather(*(client(time.monotonic() + 1.0) for _ in range(concurrency)))  # warm-up
    answered = 0
    host_before, own_before, started = cpu_seconds(host_pid), own_cpu_seconds(), time.monotonic()
    await asyncio.gather(*(client(started + seconds) for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    host_s, own_s = cpu_seconds(host_pid) - host_before, own_cpu_seconds() - own_before
    await link.close()
    return {
        "flow": flow,
        "concurrency": concurrency,
        "requests_per_s": round(answered / elapsed, 1),
        "host_us_per_request": round(host_s / answered * 1e6, 1),
        "link_us_per_request": round(own_s / answered * 1e6, 1),
        "host_cpu_busy": round(host_s / elapsed, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--tree", type=Path, help="run both sides from this copy of the repository")
    p.add_argument("--label", default="this checkout")
    p.add_argument("--concurrencies", default="1,8,64,256")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--tick-ms", type=float, default=2.0, help="the stand-ins' batch time (default %(default)s)")
    p.add_argument("--flows", default="raw", help="raw (pixels a request) and/or jpeg (an upload: decode, then infer)")
    # Compare loops by host_us_per_request only: the stand-ins tick with asyncio.sleep on the host's own
    # loop, whose timers behave differently under load on each loop, so requests/s follows the tick.
    loop_help = "the host's event loop: the engine process's (uvloop) or the one it ran before (asyncio)"
    p.add_argument("--host-loop", choices=("asyncio", "uvloop"), default="uvloop", help=loop_help)
    p.add_argument("--role", choices=("driver", "host"), default="driver", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "host":
        if args.host_loop == "asyncio":
            asyncio.run(host(args.socket, args.tick_ms / 1000))
        else:
            import uvloop

            uvloop.run(host(args.socket, args.tick_ms / 1000))
        return
    work = Path(tempfile.mkdtemp(prefix="engine-link-"))
    socket_path = str(work / "engine.sock")
    tree = (args.tree or Path(__file__).resolve().parents[1]).resolve()
    sys.path.insert(0, str(tree))  # this process's link from the tree measured, as the child's host
    env = os.environ | {"PYTHONPATH": f"{tree}:{os.environ.get('PYTHONPATH', '')}"}
    host_args = ["--socket", socket_path, "--tick-ms", str(args.tick_ms), "--host-loop", args.host_loop]
    argv = [sys.executable, __file__, "--role", "host", *host_args]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    record: dict[str, Any] = {"command": shlex.join(["python3", *sys.argv]), "label": args.label,
                              "host_loop": args.host_loop, "tree": str(tree), "points": []}  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "listening"
        for flow in args.flows.split(","):
            for concurrency in (int(c) for c in args.concurrencies.split(",")):
                segments = work / f"segments-{flow}-{concurrency}"
                segments.mkdir()
                point = asyncio.run(drive(socket_path, str(segments), concurrency, args.seconds, child.pid, flow))
                record["points"].append(point)
                print(f"{args.label}: {point}", flush=True)
    finally:
        child.kill()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
