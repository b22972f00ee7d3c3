"""The JPEG ceiling of one process: photos a second through the service's own GPU decoder and ResNet-50's
batcher, with no HTTP in front.

The server's JPEG uploads have stayed at 0.45–0.51× of the engine's peak through every front end tried
(bench/results/HISTORY.md, runs 39–47). This asks what the two GPU stages and the one event loop that joins
them can do on their own: if this process does no better than the server, the front end is not what holds
JPEG uploads, and no front end will reach issue 26's 0.6×.

    --clients coroutines, each in a loop:
        photo (500×375 JPEG, ~60 KB) → GpuJpegDecoder.decode → (1, 3, 224, 224) uint8 pixels (host, pinned copy)
        → Batcher.submit → ResNet-50's CUDA graph at the bucket the batcher picks → (1, 10) scores

The engine, the batcher and the decoder are built as the service builds them (app/service.py,
app/codecs/uploads.py): the repository's compile setting, the service's defaults for the batcher. One
engine for every point; each --decoders entry gets a decoder of its own. A point reports photos a second
and its ratio to the engine's peak (measured first, in this process), ResNet-50's mean rows and device ms a
batch, the decoder's stage times a batch, and the process's CPU seconds a second (the event loop, the
decoder's launch threads and the engine's waiters share one GIL).

    python3 bench/jpeg_ceiling.py --out $OUT/ceiling --decoders 'tv1=torchvision:1,tv2=torchvision:2,direct4=direct:4'
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

import torch

from app.ops import metric_buffers, metrics
from app.ops.switch_interval import set_switch_interval
from bench.jpeg_stages import stage_sums
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


# ResNet-50's batches over a point, each histogram's mean: rows; device ms (CUDA events); ms from launch to answers
# handed back; ms a request's rows waited in the batcher's queue.
HISTOGRAMS = {
    "rows_a_batch": metrics.BATCH_ROWS,
    "batch_device_ms": metrics.BATCH_COMPUTE,
    "batch_wall_ms": metrics.BATCH_WALL,
    "queue_wait_ms": metrics.QUEUE_WAIT,
}


def histogram_sum_count(histogram: Any) -> tuple[float, float]:
    """A prometheus histogram's sum and count over all its labels."""
    total = count = 0.0
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return total, count


def start_py_spy(py_spy: str, out: Path, tag: str, seconds: float) -> list[subprocess.Popen[bytes]]:
    """Two py-spy samplers of this process for `seconds`, neither pausing it: every thread, idle ones too (where
    each thread is: <tag>-threads.txt), and only the thread holding the GIL (who holds it: <tag>-gil.txt)."""
    common = [py_spy, "record", "--pid", str(os.getpid()), "--nonblocking", "--duration", str(int(seconds))]
    common += ["--rate", "200", "--format", "raw"]
    return [
        subprocess.Popen([*common, "--threads", "--idle", "--output", str(out / f"{tag}-threads.txt")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
        subprocess.Popen([*common, "--gil", "--threads", "--output", str(out / f"{tag}-gil.txt")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
    ]  # fmt: skip


async def point(batcher: Any, decoder: Any, spec: Any, photos: list[bytes], clients: int, seconds: float,
                profile: Callable[[], list[subprocess.Popen[bytes]]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Photos a second with `clients` uploads in flight through decode and ResNet-50, after a second's warm-up;
    `profile` starts samplers for the measured seconds."""
    done = 0
    measuring = False
    until = time.monotonic() + 1.0 + seconds

    async def client(n: int) -> None:
        nonlocal done
        turn = n
        while time.monotonic() < until:
            pixels = await decoder.decode(photos[turn % len(photos)], spec)
            await batcher.submit(pixels)
            turn += 1
            if measuring:
                done += 1

    async def measure() -> None:
        nonlocal measuring
        await asyncio.sleep(1.0)
        metric_buffers.flush()  # the batcher's buffered figures into prometheus's
        before = {name: histogram_sum_count(h) for name, h in HISTOGRAMS.items()}, stage_sums()
        samplers = profile() if profile is not None else []
        measuring, cpu, began = True, time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
        metric_buffers.flush()
        after = {name: histogram_sum_count(h) for name, h in HISTOGRAMS.items()}, stage_sums()
        figures["images_per_s"] = round(done / elapsed, 1)
        figures["cpu_s_a_s"] = round(cpu / elapsed, 2)
        for name in HISTOGRAMS:  # each histogram's mean over the window
            (total, count), (total0, count0) = after[0][name], before[0][name]
            scale = 1 if name == "rows_a_batch" else 1e3
            figures[name] = round((total - total0) / (count - count0) * scale, 2) if count > count0 else None
        stages = {}
        for stage, (total, count) in after[1].items():
            total0, count0 = before[1].get(stage, (0.0, 0.0))
            if count > count0:
                stages[stage] = round((total - total0) / (count - count0) * 1e3, 2)
        figures["decoder_ms"] = stages
        for sampler in samplers:
            await asyncio.to_thread(sampler.wait)

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
    args.out.mkdir(parents=True, exist_ok=True)
    repository = Path(tempfile.mkdtemp(prefix="jpeg-ceiling-")) / "repository"
    shutil.copytree(EXAMPLE, repository / "resnet50")
    photos = [encode(synthetic_photo(500, 375, seed=seed), quality=90) for seed in range(16)]
    record: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "photo_bytes_mean": round(sum(map(len, photos)) / len(photos)),
        "points": {},
    }
    engine, model, options, settings, build_s = build_service_engine(repository, args.buckets, args.device)
    set_switch_interval(settings.switch_interval_ms)  # the server's: how long a thread waits for the GIL

    async def run_points() -> None:
        from app.batching.batcher import Batcher
        from app.codecs.gpu_jpeg import GpuJpegDecoder

        record["engine_peak"] = peak = {**await peak_of(engine, args.peak_seconds), "build_s": build_s}
        print(f"engine peak: {peak['images_per_s']} img/s at bucket {peak['bucket']}", flush=True)
        batcher = Batcher(
            engine,
            max_delay_s=options.max_delay_ms / 1000,
            queue_limit=settings.queue_limit,
            request_timeout_s=settings.request_timeout_s,
            batch_timeout_s=settings.batch_timeout_s,
            model="resnet50",
        )
        batcher.start()
        for name, options_ in entries.items():
            decoder = GpuJpegDecoder(args.device, max_batch=args.max_batch, **options_)
            try:
                for clients in map(int, args.clients.split(",")):
                    tag = f"{name}-c{clients}"
                    profile = None
                    if tag in args.profile.split(","):
                        profile = partial(start_py_spy, args.py_spy, args.out, f"profile-{tag}", args.seconds)
                    figures = await point(batcher, decoder, model.spec, photos, clients, args.seconds, profile)
                    figures["ratio_to_engine_peak"] = round(figures["images_per_s"] / peak["images_per_s"], 3)
                    record["points"][tag] = {"decoder": options_, **figures}
                    print(f"{name} c{clients}: {figures}", flush=True)
                    (args.out / "jpeg-ceiling.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
            finally:
                decoder.close()
        await batcher.stop()

    asyncio.run(run_points())
    engine.close()
    (args.out / "jpeg-ceiling.json").write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
