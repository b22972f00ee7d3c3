"""Engine micro-benchmark on a GPU: eager forward vs bare replay vs the engine's full path.

Per bucket, medians over many runs, in µs of wall time on the host:
  eager       module(x) on the device, then the stream synchronized (launch-bound)
  replay      a bare graph of the forward alone (no copies): replay(), then the stream synchronized
  queue_sync  the engine's own graph (H2D + forward + softmax + D2H) and its events, then the
              stream synchronized: the full path without the asyncio hand-back
  engine_*    `await engine.run(slot, b)` from an asyncio loop: the engine's full path, H2D +
              forward + softmax + D2H in one replay, then the hand-back (poll / spin / block)
  ind_*       the same with inductor's kernels (compile "inductor"), against `replay_inductor`, a
              bare graph of the compiled forward alone; each of issue 12's ideas on its own:
              uint8 input (a quarter of the H2D bytes), the normalisation fused into the compiled
              forward (fewer kernels), host_io "mapped" (no memcpy nodes: the kernels read and
              write the slot's pinned memory)
Also the graph pool of all buckets vs the largest alone, and start-up times.

    python3 bench/engine_bench.py --out bench/results/<date>-engine.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

from app.config import DEFAULT_BUCKETS
from app.engines.base import Slot
from app.engines.cuda import CudaEngine
from app.engines.graph_capture import capture_graphs
from app.engines.inductor import compile_module
from models.cnn import load_model
from tests.seed_model import seed_spec

DEVICE = torch.device("cuda:0")
INDUCTOR = {"torch_compile_mode": "default", "host_io": "copy"}
VARIANTS: dict[str, tuple[dict[str, object], str]] = {  # name → (CudaEngine options, input dtype)
    "engine_graph_poll": ({"event_wait": "poll", "host_io": "copy"}, "float32"),
    "engine_graph_spin": ({"event_wait": "spin", "host_io": "copy"}, "float32"),
    "engine_graph_block": ({"event_wait": "block", "host_io": "copy"}, "float32"),
    "engine_eager_poll": ({"use_graphs": False, "event_wait": "poll", "host_io": "copy"}, "float32"),
    "engine_graph_uint8": ({"event_wait": "poll", "host_io": "copy"}, "uint8"),
    "engine_graph_mapped": ({"event_wait": "poll", "host_io": "mapped"}, "float32"),
    "ind_unfused": ({**INDUCTOR, "fuse_input": False}, "float32"),
    "ind_unfused_uint8": ({**INDUCTOR, "fuse_input": False}, "uint8"),
    "ind_fused": ({**INDUCTOR, "fuse_input": True}, "float32"),
    "ind_fused_uint8": ({**INDUCTOR, "fuse_input": True}, "uint8"),
    "ind_fused_mapped_uint8": ({**INDUCTOR, "fuse_input": True, "host_io": "mapped"}, "uint8"),
    # The service's defaults as a whole (compile inductor, fuse_input off, host_io auto, which for
    # the seed CNN's small batches maps both ends): JSON bodies give float32, raw bodies uint8.
    "ind_default": ({**INDUCTOR, "fuse_input": False, "host_io": "auto"}, "float32"),
    "ind_default_uint8": ({**INDUCTOR, "fuse_input": False, "host_io": "auto"}, "uint8"),
}
SAME_ENGINE = {
    "engine_graph_uint8": "engine_graph_poll",
    "ind_unfused_uint8": "ind_unfused",
    "ind_fused_uint8": "ind_fused",
    "ind_default_uint8": "ind_default",
}


def build(buckets: tuple[int, ...], **options: object) -> CudaEngine:
    return CudaEngine(load_model(), seed_spec(), buckets, device=DEVICE, **options)  # type: ignore[arg-type]


def _loop_factory():  # type: ignore[no-untyped-def]
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:
        return None


def median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 2)


def time_host(fn, stream: torch.cuda.Stream, iterations: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        fn()
        stream.synchronize()
        samples.append(time.perf_counter() - started)
    return median_us(samples)


def time_engine(engine: CudaEngine, slot: Slot, bucket: int, iterations: int, dtype: str) -> tuple[float, float]:
    """Median wall µs of the full path, and median device µs from its timing events."""
    pixels = np.random.default_rng(0).integers(0, 256, (bucket, 1, 28, 28), dtype=np.uint8)
    slot.inputs[dtype][:bucket] = pixels if dtype == "uint8" else pixels * np.float32(1 / 255)  # type: ignore[index]

    async def loop() -> tuple[list[float], list[float]]:
        walls, devices = [], []
        for _ in range(iterations):
            started = time.perf_counter()
            device_s = await engine.run(slot, bucket, dtype)  # type: ignore[arg-type]
            walls.append(time.perf_counter() - started)
            devices.append(device_s)
        return walls, devices

    # The server runs on uvloop (uvicorn's loop="auto"): measure the hand-back on the same loop.
    walls, devices = asyncio.run(loop(), loop_factory=_loop_factory())
    return median_us(walls), median_us(devices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    buckets = DEFAULT_BUCKETS
    record: dict[str, object] = {
        "command": " ".join(["python3", *sys.argv]),
        "date": date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(DEVICE),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "iterations": args.iterations,
        "units": "microseconds, median",
    }

    # Memory first, on a quiet allocator: the largest bucket alone, then every bucket.
    memory = {}
    for name, subset in (("largest_alone", buckets[-1:]), ("all_buckets", buckets)):
        gc.collect()
        torch.cuda.empty_cache()
        engine = build(subset)
        memory[name] = {"pool_bytes": engine.report.pool_bytes, "startup_s": round(engine.report.startup_seconds, 3)}
        engine.close()
        del engine
    memory["ratio_all_to_largest"] = round(
        memory["all_buckets"]["pool_bytes"] / memory["largest_alone"]["pool_bytes"], 3
    )
    record["memory"] = memory

    engines = {name: build(buckets, **options) for name, (options, _) in VARIANTS.items() if name not in SAME_ENGINE}
    engines |= {name: engines[twin] for name, twin in SAME_ENGINE.items()}
    slots = {name: engine.slots[0] for name, engine in engines.items()}
    record["host_io"] = {name: engine.host_io for name, engine in engines.items()}  # "copy" where mapped fell back
    record["startup_s"] = {name: round(e.report.startup_seconds, 3) for name, e in engines.items()}
    record["capture_s"] = engines["engine_graph_poll"].report.capture_seconds
    module = load_model().to(DEVICE)
    stream = torch.cuda.Stream(DEVICE)
    static_in = torch.rand((buckets[-1], 1, 28, 28), device=DEVICE)
    bare_graphs = capture_graphs(lambda b: module(static_in[:b]), buckets, stream, torch.cuda.graph_pool_handle())
    compiled = compile_module(load_model().to(DEVICE), "default", len(buckets))
    bare_inductor = capture_graphs(lambda b: compiled(static_in[:b]), buckets, stream, torch.cuda.graph_pool_handle())
    rows = {}
    for bucket in buckets:
        x = static_in[:bucket]
        with torch.inference_mode(), torch.cuda.stream(stream):
            row: dict[str, float] = {
                "eager": time_host(lambda x=x: module(x), stream, args.iterations),
                "replay": time_host(bare_graphs.graphs[bucket].replay, stream, args.iterations),
                "replay_inductor": time_host(bare_inductor.graphs[bucket].replay, stream, args.iterations),
            }
        polled = engines["engine_graph_poll"]
        state = polled._slots[0]
        row["queue_sync"] = time_host(
            lambda b=bucket, e=polled, s=state: e._queue_batch(s, b, "float32"), polled._stream, args.iterations
        )
        for name, engine in engines.items():
            dtype = VARIANTS[name][1]
            row[name], row[name + "_device"] = time_engine(engine, slots[name], bucket, args.iterations, dtype)
        for name in VARIANTS:  # each full path against the bare replay of the same forward
            if name.startswith("engine_graph"):
                row["ratio_" + name] = round(row[name] / row["replay"], 3)
            elif name.startswith("ind_"):
                row["ratio_" + name] = round(row[name] / row["replay_inductor"], 3)
        row["ratio_engine_to_replay"] = row["ratio_engine_graph_poll"]
        rows[str(bucket)] = row
        print(
            f"bucket {bucket:4d}: eager {row['eager']:7.1f}  replay {row['replay']:7.1f}  "
            + "  ".join(f"{n.removeprefix('engine_')} {row[n]:7.1f}" for n in VARIANTS)
            + "  ratios "
            + " ".join(f"{k.removeprefix('ratio_')}={v:.2f}" for k, v in row.items() if k.startswith("ratio_")),
            flush=True,
        )
    record["buckets"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(memory, indent=2))
    for engine in {id(e): e for e in engines.values()}.values():  # twins share an engine
        engine.close()


if __name__ == "__main__":
    main()
