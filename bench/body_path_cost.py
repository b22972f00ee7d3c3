"""A 150 KB one-image request's CPU in the HTTP workers, against the server's own floor (issue 26).

The issue's reading on the H200: for ResNet-50's raw uint8 body (150,528 bytes) our path cost
about four times what the HTTP server itself does (a raw ASGI no-op that reads the body and
answers a 10-class JSON). Here both run with --workers on this machine's CPU, loaded closed loop
by our generator with one image a request, and each server's CPU seconds are read from /proc:

    noop  loadtest/servers/raw_noop.py (every process of it)
    ours  app.cli serve with CGSERVE_ENGINE_PROCESS: its workers only (the engine process, the
          model's compute, is left out: on a GPU it is the device's), serving a model with
          ResNet-50's input and no compute to speak of

    PYTHONPATH=. python3 bench/body_path_cost.py --out bench/results/<name>.json [--tree DIR --label before]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.engine_link_bench import cpu_seconds
from loadtest.cli_run import load_summary
from loadtest.server_process import free_port, running, service_env

MODEL = """import torch


class FirstPixels(torch.nn.Module):  # ResNet-50's input in, 10 classes out, nothing computed
    def forward(self, x):  # (B, 3, 224, 224) → (B, 10)
        return x[:, 0, 0, :10]


def build():
    return FirstPixels().eval()
"""
TOML = """format = "python"
factory = "model:build"
input_shape = [3, 224, 224]
buckets = [1, 8, 32, 64]
labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
"""


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        for task in Path(f"/proc/{frontier.pop()}/task").iterdir():
            children = [int(c) for c in (task / "children").read_text().split()]
            found += children
            frontier += children
    return found


def spawned(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def measure(argv: list[str], env: dict[str, str], port: int, route: str, args: argparse.Namespace, work: Path,
            name: str, *, skip_engine: bool, cwd: Path | None = None) -> dict[str, Any]:  # fmt: skip
    with running(argv, work / f"{name}.log", port=port, env=env, cwd=cwd, ready_timeout_s=120) as server:
        processes = [server.proc.pid, *descendants(server.proc.pid)]
        if skip_engine:  # the manager spawns the engine process first: the lowest spawned pid
            processes.remove(min(pid for pid in processes if spawned(pid)))
        before = sum(cpu_seconds(pid) for pid in processes)
        load = ["--path", route, "--form", "raw", "--image-shape", "3,224,224", "--no-check-labels",
                "--concurrency", str(args.concurrency), "--duration", str(args.seconds), "--warmup", "0"]  # fmt: skip
        result = load_summary(server.url, work / f"{name}.json", *load, timeout_s=120)
        spent = sum(cpu_seconds(pid) for pid in processes) - before
    answered = result.get("throughput_rps", 0) * args.seconds
    result["server_us_per_request"] = round(spent / answered * 1e6, 1) if answered else None
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--tree", type=Path, help="run our server from this copy of the repository")
    p.add_argument("--label", default="this checkout")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="body-path-"))
    (work / "repository" / "pixels").mkdir(parents=True)
    (work / "repository" / "pixels" / "model.py").write_text(MODEL)
    (work / "repository" / "pixels" / "model.toml").write_text(TOML)
    record: dict[str, Any] = {"command": shlex.join(["python3", *sys.argv]), "label": args.label}
    port = free_port()
    noop = [sys.executable, "-m", "loadtest.servers.raw_noop", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(args.workers)]  # fmt: skip
    record["noop"] = measure(noop, {}, port, "/predict", args, work, "noop", skip_engine=False)
    port = free_port()
    env = service_env(port, device="cpu", model_repository=work / "repository", workers=args.workers,
                      engine_process="true", max_body_bytes=64 * 2**20)  # fmt: skip
    env["OMP_NUM_THREADS"] = "1"
    if args.tree is not None:
        env["PYTHONPATH"] = f"{args.tree.resolve()}:{os.environ.get('PYTHONPATH', '')}"
    ours = [sys.executable, "-m", "app.cli", "serve"]
    route = "/v1/models/pixels/predict"
    record["ours"] = measure(ours, env, port, route, args, work, "ours", skip_engine=True, cwd=args.tree)
    noop_us, ours_us = record["noop"]["server_us_per_request"], record["ours"]["server_us_per_request"]
    record["ours_over_noop"] = round(ours_us / noop_us, 2) if noop_us and ours_us else None
    print(f"{args.label}: noop {noop_us} µs a request ({record['noop'].get('throughput_rps')} req/s), ours {ours_us} "
          f"({record['ours'].get('throughput_rps')} req/s): {record['ours_over_noop']}×", flush=True)  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
