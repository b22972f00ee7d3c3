"""resnet50 on one GPU, then on two, through the service's own batcher, in one run.

In-process, no HTTP: the engines are built as the service builds them (engine_factory, one copy
of the module per GPU, the repository's dtype, channels_last and compile setting) and driven by
many concurrent submitters of uint8 batches, enough to keep every GPU's slots full. Phase one
serves from the cuda:0 engine alone; phase two puts the same cuda:0 engine and a cuda:1 engine
behind one batcher, which sends each batch to the least-loaded GPU. Per phase: images per
second over the measured window, and the batches each GPU launched; then the ratio two/one.

    python3 bench/multi_gpu_bench.py --compile-cache-dir /tmp/inductor-cache --out $OUT/multi-gpu

writes multi_gpu.json there. Needs two GPUs and torchvision; `--compile none` skips inductor
(faster start, slower GPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "models/examples/repository"


def build(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """One engine per GPU, as app/service.py builds them; returns the engines and their start-up figures."""
    from app.config import Settings
    from app.engines.factory import (
        build_engine,
        engine_options,
        replica_of,
        use_compile_cache,
    )
    from app.repository import load_model, read_repository

    settings = Settings(
        model_repository=EXAMPLES,
        device="cuda:0,cuda:1",
        buckets=args.buckets,
        compile=args.compile,
        in_flight=args.in_flight,
        compile_cache_dir=args.compile_cache_dir,
    )
    use_compile_cache(settings)
    (spec,) = [spec for spec in read_repository(EXAMPLES) if spec.name == "resnet50"]
    model = load_model(spec)
    options = engine_options(settings, spec, ("cuda:0", "cuda:1"))
    engines, startup = [], {}
    for index, device in enumerate(options.devices):
        started = time.perf_counter()
        replica = model if index == len(options.devices) - 1 else replica_of(model)
        engines.append(
            build_engine(replica, options, device=device, in_flight=settings.in_flight, event_wait=args.event_wait)
        )
        startup[device] = round(time.perf_counter() - started, 2)
        print(f"{device}: engine built in {startup[device]} s", file=sys.stderr, flush=True)
    facts = {
        "engine": options.engine,
        "dtype": options.dtype,
        "channels_last": options.channels_last,
        "compile": options.compile,
        "buckets": list(options.buckets),
        "in_flight_per_gpu": settings.in_flight,
        "event_wait": args.event_wait,
        "gpu": engines[0].report.facts.get("gpu"),
        "startup_s": startup,
    }
    return engines, facts


async def saturate(engines: list[Any], args: argparse.Namespace, inputs: list[np.ndarray]) -> dict[str, Any]:
    """Concurrent submitters for warm-up + measured seconds; img/s and per-GPU batches of the window."""
    from app.batching.batcher import Batcher

    batcher = Batcher(
        engines,
        max_delay_s=args.max_delay_ms / 1000,
        queue_limit=args.submitters * args.images + 1,
        request_timeout_s=60.0,
        batch_timeout_s=30.0,
        model="resnet50",
    )
    batcher.start()
    counted = False
    images = 0

    async def submitter(first: int) -> None:
        nonlocal images
        i = first
        while not stop.is_set():
            await batcher.submit(inputs[i % len(inputs)])
            if counted:
                images += args.images
            i += 1

    stop = asyncio.Event()
    tasks = [asyncio.create_task(submitter(i)) for i in range(args.submitters)]
    try:
        await asyncio.sleep(args.warmup_s)
        counted, launched_before = True, list(batcher.pool.launched)
        started = time.perf_counter()
        await asyncio.sleep(args.seconds)
        counted, elapsed = False, time.perf_counter() - started
        launched = [after - before for after, before in zip(batcher.pool.launched, launched_before, strict=True)]
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    finally:
        stop.set()
        await batcher.stop()
    if batcher.dead is not None:
        raise RuntimeError(f"a device died during the run: {batcher.dead}")
    return {
        "devices": [engine.device for engine in engines],
        "images_per_s": round(images / elapsed, 1),
        "seconds": round(elapsed, 2),
        "batches_by_device": {engine.device: n for engine, n in zip(engines, launched, strict=True)},
        "mean_rows_per_batch": round(images / max(1, sum(launched)), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for multi_gpu.json")
    parser.add_argument("--compile", default="inductor", choices=("none", "inductor", "max-autotune"))
    parser.add_argument("--compile-cache-dir", type=Path, default=None, help="inductor's cache: reuse it across runs")
    parser.add_argument("--buckets", default="32,64,128", help="captured batch sizes (default 32,64,128)")
    parser.add_argument("--in-flight", type=int, default=2, help="batches in flight per GPU (default 2)")
    parser.add_argument("--event-wait", default="poll", choices=("poll", "spin", "block"))
    parser.add_argument("--images", type=int, default=32, help="images per submitted request (default 32)")
    parser.add_argument("--submitters", type=int, default=64, help="concurrent submitters (default 64)")
    parser.add_argument("--max-delay-ms", type=float, default=1.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per phase (default 15)")
    args = parser.parse_args()

    import torch

    if torch.cuda.device_count() < 2:
        sys.stderr.write(f"this benchmark needs two GPUs; torch sees {torch.cuda.device_count()}\n")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "model": "resnet50",
        "load": {"images_per_request": args.images, "submitters": args.submitters, "warmup_s": args.warmup_s},
    }

    def save() -> None:  # after every step: a run cut short by its timeout still leaves what it measured
        (args.out / "multi_gpu.json").write_text(json.dumps(record, indent=2) + "\n")

    engines, record["settings"] = build(args)
    save()
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 256, (args.images, 3, 224, 224), dtype=np.uint8) for _ in range(8)]

    async def both_phases() -> None:
        for name, chosen in (("one_gpu", engines[:1]), ("two_gpus", engines)):  # cuda:0's engine serves both
            record[name] = await saturate(chosen, args, inputs)
            print(f"{name}: {record[name]}", file=sys.stderr, flush=True)
            save()

    asyncio.run(both_phases())
    ratio = record["two_gpus"]["images_per_s"] / record["one_gpu"]["images_per_s"]
    record["ratio_two_over_one"] = round(ratio, 3)
    save()
    print(f"two GPUs / one GPU: {ratio:.2f}x", flush=True)
    for engine in engines:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
