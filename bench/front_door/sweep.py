"""The front door under one closed-loop load, one server per setting, with where the server's time went
(issue 26 item 4: the seed CNN at 64 connections).

    PYTHONPATH=. python3 bench/front_door/sweep.py --out $OUT/sweep --hey .gpu/bin/hey --concurrency 64 \
        --variants "t8=CGSERVE_FRONT_DOOR_THREADS=8;t4=CGSERVE_FRONT_DOOR_THREADS=4,CGSERVE_IN_FLIGHT=3"

First the raw ASGI no-op (loadtest/servers/raw_noop.py, --noop-workers) under the same load: the ratio's base.
Then for each variant (name=CGSERVE_X=1,CGSERVE_Y=2, over one worker with the front door on): `app.cli serve`
on --server-cores, hey on --loadgen-cores (a second's warm-up, then --seconds) posting one random image of
--image-shape to the door's /predict, and beside its figures the step of the server's own histograms over the
load (rows a batch, the wait in the door, queue wait, a batch's launch to answers, the door's request time) and
the CPU each kind of thread used: the door's C threads (named cgserve-door), the event loop's (the main thread)
and the rest (the CUDA event waiter, torch's). With --tree, the servers run from that copy of the repository (a
tree before a change; --label names its points apart). With --rate, an open loop of our generator at that rate
in place of hey (latency from each request's scheduled send); with --trickle, one more client beside it posting a
small PNG. With --jpeg the body is a 500×375 photo sent as image/jpeg;
with --server-module bench.sim_gpu.serve the server's GPU JPEG decoder is a timed stand-in (bench/sim_gpu/
jpeg_decoder.py), for a machine without a GPU. With --echo-us, points of bench/front_door/door_echo.c as well: the
door with an ideal engine in C whose stand-in device takes that many µs a batch (the ceiling of any path behind this
door). Writes <out>/<label>sweep.json (every command and figure) as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.server_histograms import scrape, step_view
from loadtest.hey import hey_command, run_hey
from loadtest.server_process import ServerProcess, free_ports
from loadtest.stats import latency_summary_ms

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "models" / "examples" / "repository" / "fashion-cnn"
TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far of each kind of thread of `pid`: door (door.c's), loop (the main thread), other."""
    kinds: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        kind = "door" if name == "cgserve-door" else "loop" if int(task.name) == pid else "other"
        kinds[kind] += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return dict(kinds)


class Trickle(threading.Thread):
    """One keep-alive connection posting a 100×75 PNG to the door `hz` times a second beside the load: a client of
    another kind among the JPEGs (--trickle), each answer's status and time kept."""

    def __init__(self, port: int, hz: float) -> None:
        super().__init__(daemon=True)
        from loadtest.photos import encode, synthetic_photo

        self.port, self.hz = port, hz
        self.body = encode(synthetic_photo(100, 75, seed=1), "PNG")
        self.stop = threading.Event()
        self.latencies_s: list[float] = []
        self.codes: Counter[str] = Counter()

    def run(self) -> None:
        head = b"POST /predict HTTP/1.1\r\nHost: door\r\nContent-Type: image/png\r\nContent-Length: %d\r\n\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as connection:
            answers = connection.makefile("rb")
            while not self.stop.is_set():
                sent = time.monotonic()
                connection.sendall(head % len(self.body) + self.body)
                status, length = answers.readline(), 0
                while (line := answers.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                answers.read(length)
                self.latencies_s.append(time.monotonic() - sent)
                self.codes[status[9:12].decode()] += 1
                self.stop.wait(max(0.0, 1 / self.hz - (time.monotonic() - sent)))

    def figures(self) -> dict[str, Any]:
        return {"hz": self.hz, "requests": len(self.latencies_s), "status_codes": dict(self.codes),
                "latency_ms": latency_summary_ms(np.array(self.latencies_s)) if self.latencies_s else None}  # fmt: skip


def settings_of(text: str) -> dict[str, str]:
    """'CGSERVE_X=1,CGSERVE_Y=2,3' → {'CGSERVE_X': '1', 'CGSERVE_Y': '2,3'}: a new pair starts at ',CGSERVE_'."""
    return dict(pair.split("=", 1) for pair in text.replace(",CGSERVE_", "\0CGSERVE_").split("\0") if pair)


class Sweep:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        shape = tuple(int(n) for n in args.image_shape.split(","))
        self.body, self.content_type = args.out / "image.u8", "application/octet-stream"
        if args.jpeg:  # a photo of 500×375, as the JPEG benches send
            from loadtest.photos import encode, synthetic_photo

            self.body, self.content_type = args.out / "photo.jpg", "image/jpeg"
            self.body.write_bytes(encode(synthetic_photo(500, 375, seed=0), quality=90))
        else:
            self.body.write_bytes(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8).tobytes())
        self.record: dict[str, Any] = {"command": shlex.join([sys.executable, *sys.argv]), "points": {}}

    def save(self) -> None:
        (self.args.out / f"{self.args.label}sweep.json").write_text(json.dumps(self.record, indent=2) + "\n")

    def load(self, url: str) -> dict[str, Any]:
        a = self.args
        cores = ["taskset", "-c", a.loadgen_cores]
        if a.rate:
            return self.open_loop(url, cores)
        argv = hey_command(a.hey, url, self.body, content_type=self.content_type,
                           concurrency=a.concurrency, duration_s=a.seconds)  # fmt: skip
        run_hey([*cores, *argv[:2], "1s", *argv[3:]], timeout_s=30)  # warm-up
        return run_hey([*cores, *argv], timeout_s=a.seconds + 60)

    def open_loop(self, url: str, cores: list[str]) -> dict[str, Any]:
        """Our generator at --rate requests a second, each latency from its scheduled send (hey has no open loop):
        a second's warm-up, then --seconds; the same body form as hey's, on up to 1024 connections."""
        a = self.args
        base, _, path = url.partition("/predict")
        out = a.out / f"open-loop-{time.monotonic_ns()}.json"
        argv = [*cores, sys.executable, "-m", "loadtest", "--url", base, "--path", f"/predict{path}",
                "--form", "jpeg" if a.jpeg else "raw", "--image-shape", a.image_shape, "--rate", str(a.rate),
                "--duration", str(a.seconds), "--warmup", "1", "--no-check-labels", "--processes", "2",
                "--connections", "1024", "--out", str(out), "--quiet"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=a.seconds + 120)
        if done.returncode != 0 or not out.exists():
            return {"requests_per_s": None, "error": f"loadtest exited with {done.returncode}",
                    "raw_tail": (done.stdout + done.stderr)[-1500:], "command": shlex.join(argv)}  # fmt: skip
        record = json.loads(out.read_text())
        out.unlink()
        return {
            "requests_per_s": record["achieved_rate_rps"],
            "offered_rps": a.rate,
            "latency_ms": record["latency_ms"],
            "status_codes": {"200": record["counts"]["ok"]},
            "errors": record["errors"],
            "command": shlex.join(argv),
        }

    def noop(self) -> None:
        a = self.args
        (port,) = free_ports(1)
        argv = ["taskset", "-c", a.server_cores, sys.executable, "-m", "loadtest.servers.raw_noop",
                "--host", "127.0.0.1", "--port", str(port), "--workers", str(a.noop_workers)]  # fmt: skip
        server = ServerProcess(argv, a.out / "noop.log", port=port, name="raw-noop", cwd=ROOT)
        try:
            server.wait_ready(120.0)
            result = self.load(f"{server.url}/predict") | {"server_command": shlex.join(argv)}
        finally:
            server.stop()
        self.record["noop"] = result
        print(f"raw no-op × {a.noop_workers}: {result.get('requests_per_s')} req/s", flush=True)
        self.save()

    def echo(self, device_us: float) -> None:
        """One point of door_echo.c (the door, an ideal engine in C, a stand-in device of `device_us` a batch),
        built here with the door's own C, under the same load as the service's points."""
        a = self.args
        binary = a.out / "door_echo"
        if not binary.exists():
            door = ROOT / "app" / "front_door"
            sources = [
                ROOT / "bench" / "front_door" / "door_echo.c",
                *(door / f"{c}.c" for c in ("door", "grpc", "launch")),
            ]
            subprocess.run(["cc", "-O2", "-pthread", "-I", str(door), *map(str, sources), "-lnghttp2", "-ldl", "-lm",
                            "-o", str(binary)], check=True)  # fmt: skip
        (port,) = free_ports(1)
        argv = ["taskset", "-c", a.server_cores, str(binary), str(port), "8", f"{device_us:g}"]
        name = f"{a.label}echo-{device_us:g}us"
        server = ServerProcess(argv, a.out / f"server-{name}.log", port=port, name=name, cwd=ROOT)
        self.measure(name, server, port, {"server_command": shlex.join(argv)}, ready_s=30.0)

    def variant(self, name: str, settings: dict[str, str]) -> None:
        a = self.args
        port, door = free_ports(2)
        argv = ["taskset", "-c", a.server_cores, sys.executable, "-m", a.server_module, "serve", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", "--grpc-port", "0", "--front-door-port", str(door),
                "--model-repository", str(a.repository), "--log-level", "warning", "--drain-seconds", "0"]  # fmt: skip
        env = {"CGSERVE_DEVICE": a.device, "CGSERVE_COMPILE": "none", "CGSERVE_FRONT_DOOR_THREADS": "8"} | settings
        name = a.label + name
        tree = ROOT if a.tree is None else a.tree.resolve()
        if a.tree is not None:  # its own app/ first on the path
            env |= {"PYTHONPATH": f"{tree}:{os.environ.get('PYTHONPATH', '')}"}
        server = ServerProcess(argv, a.out / f"server-{name}.log", port=port, name=name, env=env, cwd=tree)
        point = {"server_command": shlex.join(argv), "env": env}
        self.measure(name, server, door, point, ready_s=240.0, metrics_url=server.url)

    def measure(self, name: str, server: ServerProcess, door: int, point: dict[str, Any], *, ready_s: float,
                metrics_url: str | None = None) -> None:  # fmt: skip
        """One point: `server` once ready, under the load on the door's port `door`, with the cores each kind of its
        threads kept busy and, where it has /metrics (`metrics_url`), the step of its histograms over the load;
        then stopped, and the point recorded."""
        try:
            server.wait_ready(ready_s)
            before = scrape(metrics_url) if metrics_url else None
            cpu_before, start = thread_cpu_s(server.proc.pid), time.monotonic()
            trickle = Trickle(door, self.args.trickle) if self.args.trickle and metrics_url else None
            if trickle is not None:
                trickle.start()
            point |= self.load(f"http://127.0.0.1:{door}/predict")
            if trickle is not None:
                trickle.stop.set()
                trickle.join(timeout=30)
                point["trickle"] = trickle.figures()
            cpu_after, wall = thread_cpu_s(server.proc.pid), time.monotonic() - start
            # Cores busy over the warm-up and the load together, each kind of thread.
            point["cores_busy"] = {k: round((cpu_after[k] - cpu_before.get(k, 0.0)) / wall, 2) for k in cpu_after}
            after = scrape(metrics_url) if metrics_url else None
            if before is not None and after is not None:
                point["server"] = step_view(before, after)
        except Exception as error:  # one point failing must not lose the others' figures
            point["error"] = f"{type(error).__name__}: {error}"
            point["log_tail"] = server.log_tail(3000)
        finally:
            server.stop()
            time.sleep(1)  # the port and the GPU's memory back before the next server
        self.finish(name, point)

    def finish(self, name: str, point: dict[str, Any]) -> None:
        """A point's ratio to the no-op, recorded and printed."""
        noop = (self.record.get("noop") or {}).get("requests_per_s")
        figure = point.get("requests_per_s")
        point["ratio_to_noop"] = round(figure / noop, 3) if figure and noop else None
        self.record["points"][name] = point
        view = point.get("server", {})
        means = {k: (view.get(k) or {}).get("mean") for k in ("batch_rows", "door_wait_ms", "queue_wait_ms",
                                                              "batch_wall_ms", "batch_compute_ms",
                                                              "handler_ms_door")}  # fmt: skip
        p99 = (point.get("latency_ms") or {}).get("p99")
        print(f"{name}: {figure} req/s ({point['ratio_to_noop']} of the no-op), p99 {p99} ms, codes "
              f"{point.get('status_codes')}; server means {means}; cores busy {point.get('cores_busy')} "
              f"{point.get('error', '')}", flush=True)  # fmt: skip
        if "trickle" in point:
            print(f"  beside it, a PNG {self.args.trickle}/s: {point['trickle']}", flush=True)
        self.save()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--out", type=Path, required=True)
    add("--hey", default=".gpu/bin/hey")
    add("--repository", type=Path, default=None, help="model repository (default: the seed CNN's alone)")
    add("--image-shape", default="1,28,28", help="the default model's input C,H,W")
    add("--concurrency", type=int, default=64)
    add("--trickle", type=float, default=0.0, help="beside the load, one connection posting a small PNG this many "
        "times a second")  # fmt: skip
    add("--rate", type=float, default=0.0, help="open loop at this many requests a second (our generator), not hey's "
        "closed loop of --concurrency")  # fmt: skip
    add("--seconds", type=float, default=4.0)
    add("--variants", default="default=", help="'name=CGSERVE_X=1,CGSERVE_Y=2;name2=…'")
    add("--noop-workers", type=int, default=8, help="the no-op's workers (0: no no-op)")
    add("--device", default="cuda")
    add("--tree", type=Path, default=None, help="run the servers from this copy of the repository")
    add("--label", default="", help="prefix of each point's name and of the record's file, e.g. before-")
    add("--jpeg", action="store_true", help="post a 500×375 JPEG photo (image/jpeg) rather than --image-shape pixels")
    add(
        "--server-module",
        default="app.cli",
        help="the server's module: app.cli, or bench.sim_gpu.serve (a CPU machine's stand-in for the GPU JPEG decoder)",
    )
    add("--echo-us", default="", help="door_echo.c's points first: a stand-in device's µs a batch, e.g. '0,100'")
    add("--server-cores", default="0-7")
    add("--loadgen-cores", default="8-15")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.repository is None:
        args.repository = args.out / "repository"
        if not args.repository.exists():
            args.repository.mkdir()
            (args.repository / SEED.name).symlink_to(SEED)
    sweep = Sweep(args)
    if args.noop_workers:
        sweep.noop()
    for device_us in filter(None, args.echo_us.split(",")):
        sweep.echo(float(device_us))
    for entry in filter(None, args.variants.split(";")):
        name, _, assignments = entry.partition("=")
        sweep.variant(name, settings_of(assignments))


if __name__ == "__main__":
    main()
