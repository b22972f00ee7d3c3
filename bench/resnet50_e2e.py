"""ResNet-50 end to end against the engine's own peak, one run (issue 12, deliverable 3).

1. The engine's peak: the service's engine (built by its own factory: fp16, channels_last, the
   repository's compile setting, uint8 input) in this process, every slot kept busy with the
   largest bucket: img/s of `await engine.run(...)` alone, no HTTP.
2. Through HTTP: the real server with 1, 2 and 4 worker processes (each with its own engine on
   the one GPU), raw uint8 bodies of 32 images (3×224×224 each), closed loop: img/s, and its
   ratio to (1) — the target is ≥ 0.85. --designs per-process,engine-process serves each worker
   count both ways, in turn: engines in every worker, or one engine process fed by the workers.
3. One image per request at concurrency 1, one worker: p50 end to end (target ≤ 1.5 ms).

The server runs on --server-cores, the generator processes on --loadgen-cores (taskset), and
the generator's CPU share is recorded beside each point. Only resnet50 is served (a temporary
repository holding the example's folder), with the buckets given; CGSERVE_COMPILE_CACHE_DIR,
where set, makes the compile warm.

    python3 bench/resnet50_e2e.py --out bench/results/<date>-resnet50-e2e.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from loadtest.cli_run import load_summary
from loadtest.server_process import free_port, running, service_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "models/examples/repository/resnet50"


class ServiceEngine(NamedTuple):
    engine: Any
    model: Any  # app.repository.LoadedModel
    options: Any  # app.engines.factory.EngineOptions
    settings: Any  # app.config.Settings
    build_s: float


def build_service_engine(repository: Path, buckets: str, device: str = "cuda") -> ServiceEngine:
    """The repository's one model's engine, built as the service builds it (its factory, the repository's compile
    setting, the settings' defaults)."""
    from app.config import Settings
    from app.engines.factory import build_engine, use_compile_cache
    from app.service import prepare_models

    settings = Settings(model_repository=repository, device=device, buckets=buckets)  # type: ignore[arg-type]
    use_compile_cache(settings)
    ((model, options),) = prepare_models(settings)
    started = time.perf_counter()
    engine = build_engine(model, options, in_flight=settings.in_flight, event_wait=settings.event_wait)
    return ServiceEngine(engine, model, options, settings, round(time.perf_counter() - started, 1))


async def peak_of(engine: Any, seconds: float) -> dict[str, Any]:
    """img/s of `engine` at its largest bucket, every slot in flight (random pixels)."""
    bucket = engine.buckets[-1]
    for slot in engine.slots:
        slot.inputs["uint8"][:] = np.random.default_rng(slot.index).integers(0, 256, slot.inputs["uint8"].shape)

    async def one_slot(slot: Any) -> int:
        batches = 0
        while time.perf_counter() < until:
            await engine.run(slot, bucket, "uint8")
            batches += 1
        return batches

    for slot in engine.slots:  # warm
        await engine.run(slot, bucket, "uint8")
    begun = time.perf_counter()
    until = begun + seconds
    batches = sum(await asyncio.gather(*(one_slot(slot) for slot in engine.slots)))
    elapsed = time.perf_counter() - begun
    return {
        "bucket": bucket,
        "in_flight": len(engine.slots),
        "images_per_s": round(batches * bucket / elapsed, 1),
        "batch_ms": round(elapsed / batches * len(engine.slots) * 1000, 3),
        "facts": {k: str(v) for k, v in engine.report.facts.items()},
    }


def engine_peak(repository: Path, buckets: str, seconds: float, device: str = "cuda") -> dict[str, Any]:
    """img/s of the service's own engine at its largest bucket, every slot in flight."""
    built = build_service_engine(repository, buckets, device)
    try:
        return {**asyncio.run(peak_of(built.engine, seconds)), "build_s": built.build_s}
    finally:
        built.engine.close()


def generate(url: str, work: Path, name: str, cores: str | None, *args: str) -> dict[str, Any]:
    """One load run against resnet50's route with raw uint8 bodies (its random weights: no label check)."""
    resnet50 = [
        "--path",
        "/v1/models/resnet50/predict",
        "--form",
        "raw",
        "--no-check-labels",
        "--image-shape",
        "3,224,224",
    ]
    return load_summary(url, work / f"{name}.json", "--warmup", "1", *resnet50, *args, cores=cores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--buckets", default="1,8,32,128")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument(
        "--designs",
        default="per-process",
        help="per-process (each worker its own engines) and/or engine-process (CGSERVE_ENGINE_PROCESS)",
    )
    parser.add_argument("--images", type=int, default=32, help="images per request at saturation")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=4, help="load-generator processes")
    parser.add_argument("--server-cores", default="0-7")
    parser.add_argument("--loadgen-cores", default="8-15")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="resnet50-e2e-"))
    repository = work / "repository"
    shutil.copytree(EXAMPLE, repository / "resnet50")
    record: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "cpu_cores": os.cpu_count()}
    record["engine_peak"] = peak = engine_peak(repository, args.buckets, args.seconds)
    print(f"engine peak: {peak}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record["http"] = {}
    designs = args.designs.split(",")
    if unknown := set(designs) - {"per-process", "engine-process"}:
        parser.error(f"--designs: {sorted(unknown)} is not per-process or engine-process")
    for workers, design in itertools.product((int(w) for w in args.workers.split(",")), designs):
        port = free_port()
        env = service_env(port, device="cuda", model_repository=repository, buckets=args.buckets, workers=workers,
                          max_body_bytes=64 * 2**20, max_inflight_bytes=1024 * 2**20,
                          engine_process=str(design == "engine-process").lower())  # fmt: skip
        key = f"{workers}_workers" + ("_engine_process" if design == "engine-process" else "")
        serve = [sys.executable, "-m", "app.cli", "serve"]
        if args.server_cores and shutil.which("taskset"):
            serve = ["taskset", "-c", args.server_cores, *serve]
        point: dict[str, Any] = {}
        with running(serve, work / f"server-{key}.log", port=port, env=env, cwd=ROOT, ready_timeout_s=400) as s:
            for concurrency in sorted({2 * workers, 4 * workers, 8}):
                load = ["--batch", str(args.images), "--concurrency", str(concurrency), "--duration", str(args.seconds),
                        "--processes", str(min(args.processes, concurrency))]  # fmt: skip
                result = generate(s.url, work, f"w{workers}-c{concurrency}", args.loadgen_cores, *load)
                ratio = None if "error" in result else round(result["images_per_s"] / peak["images_per_s"], 3)
                result["ratio_to_engine_peak"] = ratio  # None: no figure, rather than a ratio of 0
                point[f"c{concurrency}"] = result
                print(f"{key}, {args.images} images x {concurrency}: {result}", flush=True)
            if workers == 1 and design == designs[0]:
                one = ["--batch", "1", "--concurrency", "1", "--duration", str(args.seconds)]
                record["one_image_c1"] = generate(s.url, work, "one-image", args.loadgen_cores, *one)
                print(f"one image, concurrency 1: {record['one_image_c1']}", flush=True)
        record["http"][key] = point
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    best = max((p for w in record["http"].values() for p in w.values()), key=lambda p: p.get("images_per_s", 0))
    record["best_http"] = best
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({"engine_peak_img_s": peak["images_per_s"], "best_http": best}), flush=True)


if __name__ == "__main__":
    main()
