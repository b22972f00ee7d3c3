"""Engines side by side on one GPU, per bucket: what a user would pick instead of our graphs.

For one model of a repository (the seed CNN, or resnet50 fp16 channels_last), each variant is
built in a process of its own, through the service's own engine factory, and timed per bucket:

  eager                 engine eager: the module on the engine's stream, no graphs
  graph                 engine cuda-graph, compile none: a graph captured around the eager module
  reduce-overhead       engine compile, torch.compile mode reduce-overhead (PyTorch's cudagraph trees)
  compile-max-autotune  engine compile, torch.compile mode max-autotune (autotuned, with cudagraph trees)
  graph-inductor        engine cuda-graph, compile inductor: inductor's kernels in our graphs
  graph-max-autotune    engine cuda-graph, compile max-autotune: autotuned kernels in our graphs
  onnxruntime           ONNX Runtime on an ONNX export of the same weights (its CPU provider here)

Per bucket: µs per batch (median of CUDA-event device times where the engine has events, and
median wall time of `await engine.run(...)`, the full path with copies and hand-back), img/s
from the wall time; per variant: start-up seconds (build, compile, capture, validation) cold
(an empty inductor cache) and warm (a second process on the same cache), device memory.

    python3 bench/engine_compare.py --model resnet50 --buckets 1,8,32,128 \
        --variants eager,graph,reduce-overhead,graph-inductor --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REPOSITORIES = {"resnet50": ROOT / "models/examples/repository", "fashion-cnn": ROOT / "models/repository"}
VARIANTS: dict[str, dict[str, str]] = {  # name → engine options (engine, compile, compile_mode)
    "eager": {"engine": "eager"},
    "graph": {"engine": "cuda-graph", "compile": "none"},
    "reduce-overhead": {"engine": "compile", "compile_mode": "reduce-overhead"},
    "compile-max-autotune": {"engine": "compile", "compile_mode": "max-autotune"},
    "graph-inductor": {"engine": "cuda-graph", "compile": "inductor"},
    "graph-max-autotune": {"engine": "cuda-graph", "compile": "max-autotune"},
    "onnxruntime": {"engine": "onnxruntime"},
}
COMPILED = {"reduce-overhead", "compile-max-autotune", "graph-inductor", "graph-max-autotune"}


def child(model: str, variant: str, buckets: tuple[int, ...], iterations: int) -> dict[str, Any]:
    """Build one variant in this process and time it; the record goes to stdout as JSON."""
    import dataclasses

    import torch

    from app.config import Settings
    from app.engines.factory import build_engine, engine_options
    from app.repository import load_model, read_repository

    specs = {spec.name: spec for spec in read_repository(REPOSITORIES[model])}
    spec = specs[model]
    if variant == "onnxruntime":
        spec = onnx_twin(spec)
    loaded = load_model(spec)
    options = engine_options(Settings(device="cuda", buckets=buckets), spec, ("cuda:0",))
    options = dataclasses.replace(options, **VARIANTS[variant])
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    engine = build_engine(loaded, options, in_flight=1, event_wait="poll")
    startup_s = time.perf_counter() - started
    slot = engine.slots[0]
    slot.inputs["uint8"][:] = np.random.default_rng(0).integers(0, 256, slot.inputs["uint8"].shape, dtype=np.uint8)
    rows: dict[str, Any] = {}
    for bucket in buckets:
        count = iterations if variant != "onnxruntime" else max(5, iterations // 20)

        async def timed(bucket: int = bucket, count: int = count) -> tuple[list[float], list[float]]:
            walls, devices = [], []
            for _ in range(count + 5):
                begun = time.perf_counter()
                devices.append(await engine.run(slot, bucket, "uint8"))
                walls.append(time.perf_counter() - begun)
            return walls[5:], devices[5:]  # the first five warm the bucket

        walls, devices = asyncio.run(timed())
        wall_us = statistics.median(walls) * 1e6
        rows[str(bucket)] = {
            "wall_us": round(wall_us, 1),
            "device_us": round(statistics.median(devices) * 1e6, 1),
            "img_per_s": round(bucket / wall_us * 1e6),
        }
        print(f"{model} {variant:22s} bucket {bucket:4d}: {rows[str(bucket)]}", file=sys.stderr, flush=True)
    record = {
        "variant": variant,
        "options": dataclasses.asdict(options),
        "startup_s": round(startup_s, 2),
        "graph_pool_bytes": engine.report.pool_bytes,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "reserved_bytes": torch.cuda.memory_reserved(),
        "validation_relative_error": engine.report.validation_error,
        "facts": engine.report.facts,
        "buckets": rows,
    }
    engine.close()
    return record


def onnx_twin(spec: Any) -> Any:
    """The model exported to ONNX (same seeded weights) in a temporary repository folder."""
    import torch

    from app.repository import load_model, read_repository

    folder = Path(tempfile.mkdtemp(prefix="onnx-twin-")) / spec.name
    folder.mkdir()
    module = load_model(spec).module
    example = torch.rand((2, *spec.input_shape))
    batch = torch.export.Dim("batch", min=1, max=1024)
    torch.onnx.export(module, (example,), str(folder / "model.onnx"), dynamic_shapes={"x": {0: batch}}, dynamo=True)
    config = spec.config.model_dump(exclude_none=True, exclude={"architecture", "arguments", "allow_random_weights"})
    lines = [f'format = "onnx"\nfile = "model.onnx"\ninput_shape = {list(spec.input_shape)}']
    lines.append("labels = [" + ", ".join(f'"{label}"' for label in spec.class_names) + "]")
    preprocess = config.get("preprocess", {})
    if preprocess.get("mean"):
        lines.append(f"[preprocess]\nmean = {list(preprocess['mean'])}\nstd = {list(preprocess['std'])}")
    (folder / "model.toml").write_text("\n".join(lines) + "\n")
    (twin,) = read_repository(folder.parent)
    return twin


def run_child(args: argparse.Namespace, variant: str, cache: Path, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    command = [sys.executable, __file__, "--child", variant, "--model", args.model, "--buckets", args.buckets]
    command += ["--iterations", str(args.iterations)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"did not finish within {timeout_s:g} s"}
    sys.stderr.write(done.stderr[-3000:] if done.returncode else "")
    if done.returncode != 0:
        return {"variant": variant, "error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(REPOSITORIES), default="resnet50")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--buckets", default="1,8,32,128")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--timeout-s", type=float, default=420.0, help="per child process")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    buckets = tuple(int(b) for b in args.buckets.split(","))
    if args.child:
        print(json.dumps(child(args.model, args.child, buckets, args.iterations)))
        return
    import torch

    record: dict[str, Any] = {
        "command": " ".join(["python3", *sys.argv]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "model": args.model,
        "units": "µs per batch (median), images per second from the wall time",
        "variants": {},
    }
    for variant in args.variants.split(","):
        with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
            result = run_child(args, variant, Path(cache), args.timeout_s)
            if variant in COMPILED and "error" not in result:  # again on the now-warm cache
                warm = run_child(args, variant, Path(cache), args.timeout_s)
                result["startup_s_cold"] = result.pop("startup_s")
                result["startup_s_warm"] = warm.get("startup_s", warm.get("error"))
        record["variants"][variant] = result
        if args.out:  # after each variant: a timed-out run still leaves what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"{variant}: done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
