"""JPEG uploads, img/s: Pillow on the CPU (the service's decode pool) against the batched GPU decoder.

Two parts, one run, one JSON record:
  decode    the service's own upload path (app/codecs/uploads.py decode_upload) with no HTTP, `--clients`
            uploads in flight at once and one at a time: Pillow on app/ops/off_loop.py's pool, or nvJPEG.
  http      the real server twice (CGSERVE_JPEG_DECODER=cpu, then gpu), resnet50 (fp16, channels_last)
            alone, multipart JPEG uploads from loadtest's closed-loop generator.

Photos: loadtest/photos.py's synthetic ones at 500×375 and 1920×1080, quality 90; preprocess:
resnet50's model.toml (shorter side 256, centre crop 224). On the H200 (16 cores), 2–4 minutes
(--compile none, or a warm CGSERVE_COMPILE_CACHE_DIR, keeps it near 2):

    python3 bench/jpeg_decode_bench.py --out "$OUT/jpeg"     # or: STEPS=jpeg bash bench/run_h200.sh

Without CUDA only Pillow is measured (`--model fashion-cnn --repository models/repository` runs it
on a laptop).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from app.codecs.uploads import JpegBatchDecoder, decode_upload
from app.ops.off_loop import _pool as decode_pool
from app.repository import read_repository
from app.repository.model_spec import ModelSpec
from loadtest.payloads import MULTIPART_CONTENT_TYPE, Payloads, multipart_body
from loadtest.photos import encode, synthetic_photo
from loadtest.runner import run_load
from loadtest.server_process import free_port, running, service_env
from loadtest.spec import LoadSpec

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"500x375": (500, 375), "1920x1080": (1920, 1080)}
PHOTOS_PER_SIZE = 16
# 1920×1080 is over the default limit for a 224×224 model (16× its input, at least 1024²): raised here.
PIXEL_LIMIT = 4096 * 4096


@functools.cache
def jpegs(width: int, height: int) -> list[bytes]:
    return [encode(synthetic_photo(width, height, seed=i), quality=90) for i in range(PHOTOS_PER_SIZE)]


async def decode_rate(
    photos: list[bytes], spec: ModelSpec, gpu: JpegBatchDecoder | None, *, clients: int, seconds: float
) -> dict[str, float]:
    """`clients` uploads in flight through decode_upload for `seconds`: images per second and mean latency."""
    limit = spec.max_image_pixels(PIXEL_LIMIT)
    done, latency = 0, 0.0
    stop = time.perf_counter() + seconds

    async def client(offset: int) -> None:
        nonlocal done, latency
        i = offset
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await decode_upload(photos[i % len(photos)], max_pixels=limit, spec=spec, gpu=gpu)
            latency += time.perf_counter() - started
            done, i = done + 1, i + 1

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.perf_counter() - started
    return {"images_per_s": round(done / elapsed, 1), "mean_latency_ms": round(1000 * latency / max(done, 1), 3)}


async def decode_part(spec: ModelSpec, device: str, clients: int, seconds: float) -> dict[str, Any]:
    gpu: JpegBatchDecoder | None = None
    if device.startswith("cuda"):
        from app.codecs.gpu_jpeg import GpuJpegDecoder

        gpu = GpuJpegDecoder(device)
    part: dict[str, Any] = {"pillow_threads": decode_pool._max_workers, "clients": clients, "seconds": seconds}
    try:
        for name, size in SIZES.items():
            photos = jpegs(*size)
            point: dict[str, Any] = {}
            for decoder, chosen in (("pillow", None), ("gpu", gpu)):
                if decoder == "gpu" and gpu is None:
                    continue
                await decode_rate(photos, spec, chosen, clients=clients, seconds=0.5)  # warm-up (nvJPEG init)
                before = (getattr(chosen, "batches_launched", 0), getattr(chosen, "images_launched", 0))
                point[decoder] = {
                    f"clients_{c}": await decode_rate(photos, spec, chosen, clients=c, seconds=seconds)
                    for c in (clients, 1)
                }
                if gpu is not None and decoder == "gpu":
                    batches = gpu.batches_launched - before[0]  # type: ignore[attr-defined]
                    images = gpu.images_launched - before[1]  # type: ignore[attr-defined]
                    point[decoder]["mean_batch_images"] = round(images / max(batches, 1), 2)
            if "gpu" in point:
                many = f"clients_{clients}"
                point["gpu_over_pillow"] = round(
                    point["gpu"][many]["images_per_s"] / point["pillow"][many]["images_per_s"], 2
                )
            part[name] = point
            print(f"decode {name}: {json.dumps(point)}", flush=True)
    finally:
        if gpu is not None:
            gpu.close()
    return part


def http_part(args: argparse.Namespace, decoders: list[str], work: Path) -> dict[str, Any]:
    repository = work / "repository"  # the chosen model alone: one engine to build per server
    shutil.copytree(args.repository / args.model, repository / args.model)
    part: dict[str, Any] = {"clients": args.clients, "seconds": args.http_seconds, "compile": args.compile}
    for decoder in decoders:
        port = free_port()
        env = service_env(
            port, device=args.device, model_repository=repository, jpeg_decoder=decoder, compile=args.compile,
            buckets="1,8,32", max_image_pixels=PIXEL_LIMIT, compile_cache_dir=args.compile_cache_dir,
        )  # fmt: skip
        serve = [sys.executable, "-m", "app.cli", "serve"]
        log = work / f"server-{decoder}.log"
        with running(serve, log, port=port, env=env, cwd=ROOT, ready_timeout_s=args.start_timeout) as server:
            point: dict[str, Any] = {}
            for name, size in SIZES.items():
                bodies = tuple(
                    multipart_body(data, filename=f"{name}-{i}.jpg", content_type="image/jpeg")
                    for i, data in enumerate(jpegs(*size))
                )
                payloads = Payloads("jpeg", f"/v1/models/{args.model}/predict", MULTIPART_CONTENT_TYPE, bodies, None, 1)
                spec = LoadSpec(
                    url=server.url, concurrency=args.clients, processes=2, warmup_s=1.0, duration_s=args.http_seconds
                )
                record = run_load(spec, payloads, command="bench/jpeg_decode_bench.py", progress=False)
                point[name] = {
                    key: record[key] for key in ("images_per_s", "throughput_rps", "latency_ms", "errors")
                } | {"loadgen_cpu_busy": record.get("loadgen_cpu_busy")}
                print(f"http {decoder} {name}: {json.dumps(point[name])[:400]}", flush=True)
            metrics = server_metrics(server.url)
            point["decodes"] = metrics
        part[decoder] = point
    if {"cpu", "gpu"} <= set(part):
        part["gpu_over_cpu"] = {
            name: round(part["gpu"][name]["images_per_s"] / max(part["cpu"][name]["images_per_s"], 1e-9), 2)
            for name in SIZES
        }
    return part


def server_metrics(url: str) -> dict[str, float]:
    """The server's decode counters and its nvJPEG batch sizes (sum and count), from /metrics."""
    import httpx

    wanted = ("cgserve_image_decodes_total", "cgserve_gpu_jpeg_batch_images_sum", "cgserve_gpu_jpeg_batch_images_count")
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(wanted)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for jpeg_decode.json and the server logs")
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repository", type=Path, default=ROOT / "models/examples/repository")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--clients", type=int, default=64, help="uploads in flight (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per decode-only point (default %(default)s)")
    parser.add_argument("--http-seconds", type=float, default=6.0, help="per HTTP point (default %(default)s)")
    parser.add_argument("--compile", choices=("none", "inductor", "max-autotune"), default="inductor")
    parser.add_argument("--compile-cache-dir", type=Path, default=Path("/tmp/inductor-cache"))
    parser.add_argument("--start-timeout", type=float, default=240.0, help="seconds for a server to be ready")
    parser.add_argument("--skip-http", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (spec,) = [s for s in read_repository(args.repository) if s.name == args.model]
    record: dict[str, Any] = {
        "command": " ".join(["python3", *sys.argv]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "photos": f"loadtest/photos.py synthetic_photo, {PHOTOS_PER_SIZE} per size, JPEG quality 90",
        "preprocess": spec.preprocess.model_dump(),
        "max_image_pixels": PIXEL_LIMIT,
    }
    out = args.out / "jpeg_decode.json"
    record["decode"] = asyncio.run(decode_part(spec, args.device, args.clients, args.seconds))
    out.write_text(json.dumps(record, indent=2) + "\n")
    if not args.skip_http:
        decoders = ["cpu", "gpu"] if args.device.startswith("cuda") else ["cpu"]
        work = Path(tempfile.mkdtemp(prefix="jpeg-bench-"))
        try:
            record["http"] = http_part(args, decoders, work)
        finally:
            for log in work.glob("server-*.log"):
                shutil.copy(log, args.out / log.name)
        out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
