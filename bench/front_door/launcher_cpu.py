"""The door's launcher (app/front_door/launch.c) against the door's ceiling, on a machine without a GPU.

Two servers under the same closed-loop load (hey), alternated:
- echo: bench/front_door/door_echo.c with a stand-in device of 0 µs a batch, answering a fixed body (the door with
  an ideal engine: no work a row);
- launcher: the door with launch.c open on three stand-in slots, driven through tests/integration/fake_cuda.c (a
  "graph" scores its rows at once, an event is always done), so launch.c's own work a batch is all there is:
  taking the slot, its rows copied in, each row's argmax and scores written as orjson writes them.

The ratio says what launch.c's C costs against nothing at all; the GPU's share (its batches' time) is what
run 56a's door_echo points at 50–150 µs a batch measured.

    PYTHONPATH=. python3 -m bench.front_door.launcher_cpu --hey .gpu/bin/hey --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.hey import hey_command, run_hey
from loadtest.server_process import ServerProcess, free_ports

ROOT = Path(__file__).resolve().parents[2]
DOOR = ROOT / "app" / "front_door"
BUCKETS, WIDTH, SHAPE = (1, 2, 4, 8, 16, 32, 64), 10, (1, 28, 28)


def serve(port: int, threads: int, work: Path) -> None:
    """The door with its launcher on stand-in slots, on 127.0.0.1:`port` until killed."""
    from app.front_door.door import Door, Limits
    from app.front_door.library import door_library
    from tests.integration.fake_cuda import build_fake_cuda, stand_in_slots

    build_fake_cuda(work)
    listener = socket.create_server(("127.0.0.1", port), backlog=4096)
    listener.setblocking(False)
    wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    limits = Limits(max_connections=4096, keepalive_s=60, request_s=30, tokens=(), max_bytes=2**30, max_pixels=2**26)
    door = Door(door_library(None), listener, threads=threads, shape=SHAPE, buffers=3, wake_fd=wake,
                path=b"/predict", full_rows=BUCKETS[-1], limits=limits)  # fmt: skip
    slots = stand_in_slots(BUCKETS, SHAPE, WIDTH)  # alive while the launcher is, until killed
    prefix = b'{"model":"fashion-cnn","engine":"cuda-graph","postprocess":"softmax","predictions":[{"label":'
    names = [b',"class_name":"class %d","scores":[' % j for j in range(WIDTH)]
    door.open_launcher(slots.handles, prefix, names, (b"503 Service Unavailable", b"", b"{}"), 30.0)
    door.set_gets([(b"/readyz", b"200 OK\r\ncontent-type: text/plain\r\n", b"ready", False)])
    print(f"launcher on 127.0.0.1:{port}, {threads} threads", flush=True)
    while True:
        time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=Path("/tmp/launcher-cpu"))
    p.add_argument("--hey", default=".gpu/bin/hey")
    p.add_argument("--out", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-cores", default="0")
    p.add_argument("--loadgen-cores", default="1")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    if a.serve:
        serve(a.serve, a.threads, a.work)
        return
    echo = a.work / "door_echo"
    sources = [ROOT / "bench" / "front_door" / "door_echo.c"] + [DOOR / f"{c}.c" for c in ("door", "grpc", "launch")]
    subprocess.run(["cc", "-O2", "-pthread", "-I", str(DOOR), *map(str, sources), "-lnghttp2", "-ldl", "-lm", "-o",
                    str(echo)], check=True)  # fmt: skip
    body = a.work / "image.u8"
    body.write_bytes(np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8).tobytes())
    record: dict[str, Any] = {"command": shlex.join([sys.executable, "-m", "bench.front_door.launcher_cpu",
                                                     *sys.argv[1:]]), "points": []}  # fmt: skip
    pin = ["taskset", "-c", a.server_cores]
    for round_ in range(a.rounds):
        for name in ("echo", "launcher"):
            (port,) = free_ports(1)
            argv = [*pin, str(echo), str(port), str(a.threads), "0"] if name == "echo" else [
                *pin, sys.executable, "-m", "bench.front_door.launcher_cpu", "--serve", str(port), "--threads",
                str(a.threads), "--work", str(a.work)]  # fmt: skip
            server = ServerProcess(argv, a.work / f"{name}.log", port=port, name=name, cwd=ROOT)
            try:
                server.wait_ready(60.0)
                command = hey_command(a.hey, f"{server.url}/predict", body, content_type="application/octet-stream",
                                      concurrency=a.concurrency, duration_s=a.seconds)  # fmt: skip
                result = run_hey(["taskset", "-c", a.loadgen_cores, *command], timeout_s=a.seconds + 60)
            finally:
                server.stop()
            point = {"round": round_, "server": name, "requests_per_s": result.get("requests_per_s"),
                     "p99_ms": (result.get("latency_ms") or {}).get("p99"),
                     "status_codes": result.get("status_codes"), "server_command": shlex.join(argv)}  # fmt: skip
            record["points"].append(point)
            print(json.dumps(point), flush=True)
    for name in ("echo", "launcher"):
        figures = [p["requests_per_s"] for p in record["points"] if p["server"] == name and p["requests_per_s"]]
        record[f"{name}_requests_per_s"] = figures
    pairs = zip(record["echo_requests_per_s"], record["launcher_requests_per_s"], strict=False)
    record["launcher_over_echo_each_round"] = [round(b / e, 3) for e, b in pairs]
    print("launcher ÷ echo, each round:", record["launcher_over_echo_each_round"], flush=True)
    if a.out:
        a.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
