"""Device memory of the two process designs: N workers with their own engines, against N workers
feeding one engine process (CGSERVE_ENGINE_PROCESS), same model and settings, read from
nvidia-smi once each server is ready and has answered a few requests.

    PYTHONPATH=. python3 bench/design_memory.py --out $OUT/design-memory.json [--workers 8]

Per design: the GPU's memory in use (less what was in use before the server started) and each
compute process's share. Writes the JSON record and prints one line per design.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from loadtest.server_process import ServerProcess, free_port

SERVE = "{python} -m app.cli serve --host 127.0.0.1 --port {port} --grpc-port 0 --log-level warning --workers {workers} --device {device} --compile {compile} --drain-seconds 0"  # noqa: E501
DESIGNS = {"per-process": "", "engine-process": " --engine-process"}


def gpu_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.split()[0])


def compute_apps() -> list[dict[str, int]]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [{"pid": int(pid), "mib": int(mib)} for pid, mib in (line.split(",") for line in out.splitlines() if line)]


def measure(design: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    argv = shlex.split(
        SERVE.format(python=sys.executable, port=port, workers=args.workers, compile=args.compile, device=args.device)
        + DESIGNS[design]
    )
    baseline = gpu_used_mib()
    server = ServerProcess(argv, args.out.parent / f"design-memory-{design}.log", port=port, name=design)
    try:
        ready_s = server.wait_ready(args.startup_timeout)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for _ in range(4 * args.workers):  # new connections: every worker answers some
                assert client.post("/predict", json={"instances": [[0.0] * 784]}).status_code == 200
        time.sleep(1.0)
        apps = compute_apps()
        used = gpu_used_mib()
    finally:
        server.stop()
    record = {
        "design": design,
        "command": shlex.join(argv),
        "ready_s": round(ready_s, 1),
        "gpu_used_mib": used - baseline,
        "compute_processes": len(apps),
        "per_process_mib": sorted(app["mib"] for app in apps),
    }
    print(f"{design}: {record['gpu_used_mib']:,} MiB on the GPU in {record['compute_processes']} processes "
          f"({record['per_process_mib']}), ready in {record['ready_s']} s", flush=True)  # fmt: skip
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--compile", default="none", choices=("none", "inductor"))
    p.add_argument("--device", default="cuda", help="the servers' --device (cpu: the plumbing alone)")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    designs = [measure(design, args) for design in DESIGNS]
    command = shlex.join(["python3", "bench/design_memory.py", *sys.argv[1:]])
    report = {"command": command, "started_at": started, "workers": args.workers, "designs": designs}
    if designs[1]["gpu_used_mib"]:
        report["per_process_over_engine_process"] = round(designs[0]["gpu_used_mib"] / designs[1]["gpu_used_mib"], 2)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
