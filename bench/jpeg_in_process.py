"""JPEG uploads through the service's own GPU decoder and ResNet-50's batcher in one process, with no HTTP in front.

Is the front end what holds the server's JPEG uploads? This drives the two GPU stages, and the one event loop that
joins them, from coroutines in the process that holds them, with no socket and no door: if the server does as well,
the front end is not the limit. It is not a ceiling: its clients cost Python of their own (a task and two awaits an
upload, where the front door answers from callbacks a bulk at a time).

    --clients coroutines, each in a loop:
        photo (500×375 JPEG, quality 90, a writable bytearray as the door's rows are)
        → GpuJpegDecoder.decode(out=the client's own row) → (1, 3, 224, 224) uint8 pixels in that row
        → Batcher.submit → ResNet-50's CUDA graph at the bucket the batcher picks → (1, 10) scores

Built as the service builds them (app/service.py, app/codecs/uploads.py): the engine by its factory with the
repository's compile setting, the batcher with the settings' defaults, the decoder from each --decoders entry;
the server's GIL switch interval; the start-up heap frozen; uvloop where installed. One engine for every point.
A point reports photos a second and its ratio to the engine's peak (measured first, in this process), the service's
own histograms over its window as one_image reads a server's (ResNet-50's rows, device ms and queue wait, the
decoder's stage times), the decoder's kind and mean batch, and the process's CPU seconds a second (the event
loop, the decoder's launch threads and the engine's waiters share one GIL).

    python3 bench/jpeg_in_process.py --out $OUT/in-process --decoders 'tv2=torchvision:2,direct2=direct:2:pre:high'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import prometheus_client
import torch

from app.ops import metric_buffers
from app.ops.heap import freeze_startup_heap
from app.ops.switch_interval import set_switch_interval
from bench.harness.server_histograms import Snapshot, snapshot, step_view
from bench.resnet50_e2e import EXAMPLE, build_service_engine, peak_of
from loadtest.photos import encode, synthetic_photo


def decoder_entries(text: str) -> dict[str, dict[str, Any]]:
    """'name=KIND:LAUNCHES[:pre][:high],…' → {name: GpuJpegDecoder's keyword arguments}."""
    entries = {}
    for entry in filter(None, text.split(",")):
        name, _, spec = entry.partition("=")
        kind, launches, *flags = spec.split(":")
        unknown = set(flags) - {"pre", "high"}
        if kind not in ("torchvision", "direct") or unknown:
            raise SystemExit(f"--decoders {entry!r}: KIND is torchvision or direct, flags pre and high; got {spec!r}")
        entries[name] = {
            "nvjpeg": kind,
            "launches": int(launches),
            "preallocate": (500, 375) if "pre" in flags else None,
            "priority": "high" if "high" in flags else "normal",
        }
    return entries


def start_py_spy(py_spy: str, out: Path, tag: str, seconds: float) -> list[tuple[str, subprocess.Popen[bytes]]]:
    """Two py-spy samplers of this process for `seconds` (whole, rounded up), neither pausing it: every thread, idle
    ones too (where each thread is: <tag>-threads.txt), and only the thread holding the GIL (who holds it:
    <tag>-gil.txt). Each one's output goes beside its profile (.log)."""
    common = [py_spy, "record", "--pid", str(os.getpid()), "--nonblocking", "--duration", str(math.ceil(seconds))]
    common += ["--rate", "200", "--format", "raw"]
    samplers = []
    for name, options in (("threads", ["--threads", "--idle"]), ("gil", ["--gil", "--threads"])):
        log = (out / f"{tag}-{name}.log").open("wb")
        command = [*common, *options, "--output", str(out / f"{tag}-{name}.txt")]
        samplers.append((name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)))
    return samplers


async def point(batcher: Any, decoder: Any, spec: Any, photos: list[bytearray], clients: int, seconds: float,
                profile: Callable[[], list[tuple[str, subprocess.Popen[bytes]]]] | None = None
                ) -> dict[str, Any]:  # fmt: skip
    """Photos a second with `clients` uploads in flight through decode and ResNet-50, over `seconds` after one of
    warm-up; `profile` starts samplers for those seconds. The clients stop once the window's figures are read."""
    rows = np.zeros((clients, *spec.input_shape), np.uint8)  # each client's row, as the door's bulk has one a request
    done, measuring, stop = 0, False, asyncio.Event()

    async def client(n: int) -> None:
        nonlocal done
        turn, row = n, rows[n : n + 1]
        while not stop.is_set():
            pixels = await decoder.decode(photos[turn % len(photos)], spec, out=row)
            await batcher.submit(pixels)
            turn += 1
            if measuring:
                done += 1

    def counts() -> tuple[Snapshot, int, int]:
        metric_buffers.flush()  # the batcher's buffered figures into prometheus's
        text = prometheus_client.generate_latest().decode()  # this process's registry: the service's histograms
        return snapshot(text), decoder.batches_launched, decoder.images_launched

    async def measure() -> None:
        nonlocal measuring
        try:
            await asyncio.sleep(1.0)
            samplers = profile() if profile is not None else []
            before = counts()
            measuring, cpu, began = True, time.process_time(), time.perf_counter()
            await asyncio.sleep(seconds)
            measuring = False
            elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
            after = counts()
        finally:
            stop.set()
        figures["images_per_s"] = round(done / elapsed, 1)
        figures["cpu_s_a_s"] = round(cpu / elapsed, 2)
        # ResNet-50's batches (batch_rows, batch_compute_ms: on the device, batch_wall_ms, queue_wait_ms) and the
        # GPU decoder's (jpeg_wait_ms: an upload's wait for its launch, jpeg_batch_ms, jpeg_stage_ms_<stage>) over
        # the window: count, mean, p50, p99, as one_image reads a server's.
        figures["server"] = step_view(before[0], after[0])
        batches, images = after[1] - before[1], after[2] - before[2]
        figures["decoder"] = {"kind": decoder.nvjpeg, "launches": decoder.launches,
                              "photos_a_batch": round(images / batches, 1) if batches else None}  # fmt: skip
        for name, sampler in samplers:
            try:
                figures.setdefault("py_spy", {})[name] = await asyncio.to_thread(sampler.wait, 30 + seconds)
            except subprocess.TimeoutExpired:
                sampler.kill()
                figures.setdefault("py_spy", {})[name] = "killed: still sampling 30 s after its window"

    figures: dict[str, Any] = {"clients": clients}
    await asyncio.gather(measure(), *(client(n) for n in range(clients)))
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--buckets", default="1,8,32,64,128")
    p.add_argument("--clients", default="1024,256", help="uploads in flight, comma-separated")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds a point (after 1 s of warm-up)")
    p.add_argument("--peak-seconds", type=float, default=4.0)
    p.add_argument("--max-batch", type=int, default=128, help="the decoder's largest batch (CGSERVE_JPEG_MAX_BATCH)")
    p.add_argument(
        "--decoders",
        default="tv1=torchvision:1,tv2=torchvision:2,direct2=direct:2:pre:high,direct4=direct:4:pre:high",
        help="name=KIND:LAUNCHES[:pre][:high], comma-separated: torchvision or direct; pre: states preallocated for "
        "500x375; high: the decoder's streams at high priority",
    )
    p.add_argument("--profile", default="", help="points py-spy samples, e.g. tv2-c1024,direct2-c1024")
    p.add_argument("--py-spy", default="/tmp/site/bin/py-spy")
    args = p.parse_args()
    entries = decoder_entries(args.decoders)
    if args.profile and shutil.which(args.py_spy) is None:  # refused now, not after minutes of start-up
        p.error(f"--profile needs py-spy: {args.py_spy} is not an executable")
    args.out.mkdir(parents=True, exist_ok=True)
    repository = Path(tempfile.mkdtemp(prefix="jpeg-in-process-")) / "repository"
    shutil.copytree(EXAMPLE, repository / "resnet50")
    # Writable, as the door's rows are: bytes would be copied once an upload on the launch thread.
    photos = [bytearray(encode(synthetic_photo(500, 375, seed=seed), quality=90)) for seed in range(16)]
    record: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "photo_bytes_mean": round(sum(map(len, photos)) / len(photos)),
        "points": {},
    }
    engine, model, options, settings, build_s = build_service_engine(repository, args.buckets, args.device)
    set_switch_interval(settings.switch_interval_ms)  # the server's: how long a thread waits for the GIL

    def save() -> None:
        (args.out / "jpeg-in-process.json").write_text(json.dumps(record, indent=1, default=str) + "\n")

    async def run_points() -> None:
        from app.batching.batcher import Batcher
        from app.codecs.gpu_jpeg import GpuJpegDecoder

        record["engine_peak"] = peak = {**await peak_of(engine, args.peak_seconds), "build_s": build_s}
        print(f"engine peak: {peak['images_per_s']} img/s at bucket {peak['bucket']}", flush=True)
        batcher = Batcher(  # as app/service.py builds it
            engine,
            max_delay_s=options.max_delay_ms / 1000,
            queue_limit=settings.queue_limit,
            request_timeout_s=settings.request_timeout_s,
            batch_timeout_s=settings.batch_timeout_s,
            model=model.spec.name,
            version=model.spec.version,
            just_in_time=settings.batch_launch == "just-in-time",
            fastest_bucket=settings.busy_batch == "fastest-bucket",
        )
        batcher.start()
        freeze_startup_heap()  # as the service does once started: collections then skip torch's and inductor's heap
        try:
            for name, decoder_options in entries.items():
                decoder = GpuJpegDecoder(args.device, max_batch=args.max_batch, **decoder_options)
                try:
                    for clients in map(int, args.clients.split(",")):
                        tag = f"{name}-c{clients}"
                        profile = None
                        if tag in args.profile.split(","):
                            profile = partial(start_py_spy, args.py_spy, args.out, f"profile-{tag}", args.seconds)
                        figures = await point(batcher, decoder, model.spec, photos, clients, args.seconds, profile)
                        figures["ratio_to_engine_peak"] = round(figures["images_per_s"] / peak["images_per_s"], 3)
                        record["points"][tag] = {"asked": decoder_options, **figures}
                        print(f"{tag}: {figures}", flush=True)
                        save()
                finally:
                    decoder.close()
        finally:
            await batcher.stop()

    run = asyncio.run
    with contextlib.suppress(ImportError):  # the server's loop where installed (uvicorn's "auto", the door's)
        import uvloop

        run = uvloop.run
    try:
        run(run_points())
    finally:
        engine.close()
        save()


if __name__ == "__main__":
    main()
