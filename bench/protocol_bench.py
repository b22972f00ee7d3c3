"""The service through its protocols, one server, one run: perf_analyzer over the Open Inference
Protocol (HTTP and gRPC), our own generator at the same concurrencies (raw bytes and JSON on
/predict), and resnet50 at saturation with raw uint8 bodies of several images.

    python3 bench/protocol_bench.py --perf-analyzer /tmp/site/perf_analyzer/bin/perf_analyzer \
        --out bench/results/<date>-protocols.json

Needs a GPU for the numbers that matter (it runs on the CPU too); perf_analyzer needs glibc ≥ 2.38.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtest.cli_run import load_summary
from loadtest.server_process import free_ports, running

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "models/examples/repository"


def perf_analyzer(binary: str, protocol: str, address: str, concurrency: int, work: Path) -> dict[str, Any]:
    """One concurrency point: perf_analyzer's own CSV (throughput and latency percentiles, µs)."""
    out = work / f"pa-{protocol}-{concurrency}.csv"
    argv = [
        binary, "-m", "fashion-cnn", "-u", address, "-i", protocol, "-b", "1", "--input-data", "zero",
        "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", "2000",
        "--stability-percentage", "25", "--max-trials", "5", "-f", str(out),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr)[-1500:]}
    (row,) = list(csv.DictReader(out.open()))
    return {
        "throughput_rps": float(row["Inferences/Second"]),
        "latency_ms": {q: int(row[f"{q} latency"]) / 1000 for q in ("p50", "p90", "p99")},
    }


def generator(url: str, work: Path, name: str, *args: str) -> dict[str, Any]:
    return load_summary(url, work / f"{name}.json", "--warmup", "1", *args, timeout_s=180)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perf-analyzer", default="/tmp/site/perf_analyzer/bin/perf_analyzer")
    parser.add_argument("--concurrencies", default="1,4,16,64")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repository", type=Path, default=EXAMPLES, help="resnet50's part runs where it holds one")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="protocol-bench-"))
    port, grpc_port = free_ports(2)
    env = {
        "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": str(grpc_port),
        "CGSERVE_DEVICE": args.device, "CGSERVE_MODEL_REPOSITORY": str(args.repository),
        "CGSERVE_DEFAULT_MODEL": "fashion-cnn",
        "CGSERVE_BUCKETS": "1,8,32", "CGSERVE_LOG_LEVEL": "warning",
    }  # fmt: skip
    record: dict[str, Any] = {
        "command": " ".join(["python3", *sys.argv]),
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "server": "one process, models/examples/repository (fashion-cnn fp32 and resnet50 fp16 channels_last, "
        "graph engine with inductor kernels), buckets 1,8,32 (compiled by the GPU tests just before: a warm cache)",
        "points": {},
    }
    serve = [sys.executable, "-m", "app.cli", "serve"]
    with running(serve, work / "server.log", port=port, env=env, cwd=ROOT, ready_timeout_s=480) as server:
        for c in (int(v) for v in args.concurrencies.split(",")):
            point: dict[str, Any] = {
                "perf_analyzer_http": perf_analyzer(args.perf_analyzer, "http", f"127.0.0.1:{port}", c, work),
                "perf_analyzer_grpc": perf_analyzer(args.perf_analyzer, "grpc", f"127.0.0.1:{grpc_port}", c, work),
            }
            common = ["--concurrency", str(c), "--duration", "3"]
            point["loadtest_predict_raw"] = generator(server.url, work, f"raw-{c}", "--form", "raw", *common)
            point["loadtest_predict_json"] = generator(server.url, work, f"json-{c}", "--form", "json", *common)
            record["points"][str(c)] = point
            print(f"concurrency {c}: {json.dumps(point)[:600]}", flush=True)
            args.out.write_text(json.dumps(record, indent=2) + "\n")
        # resnet50 end to end: raw uint8 bodies of 32 images (3×224×224 each), at saturation.
        for images in (32, 1) if (args.repository / "resnet50").is_dir() else ():
            name = f"resnet50-raw-{images}"
            record[name] = generator(
                server.url, work, name, "--path", "/v1/models/resnet50/predict", "--form", "raw", "--batch",
                str(images), "--concurrency", "16" if images > 1 else "1", "--duration", "5", "--no-check-labels",
                "--image-shape", "3,224,224",
            )  # fmt: skip
            print(f"{name}: {record[name]}", flush=True)
        record["server_log_tail"] = server.log_tail()[-2000:]
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
