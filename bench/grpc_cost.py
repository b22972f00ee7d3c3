"""gRPC against v2 HTTP binary: the server's CPU a request, and latency at one in flight (issue 26.3).

The issue asks gRPC for ≥ 0.9× v2 HTTP binary's throughput with the same workers, and a p50 of
≤ 0.5 ms at concurrency 1 with one worker, seed CNN. Where the server is CPU-bound, throughput
is the inverse of its CPU a request, so the ratio of the two protocols' CPU a request, measured on
any machine, is what the H200 will show as a throughput ratio. One server (the seed CNN on the
CPU, or with --device cuda on the GPU, one worker, gRPC on), then for each protocol and
concurrency a driver process that sends one prebuilt request over and over (a bare asyncio
HTTP/1.1 client for HTTP; grpc.aio for gRPC, a ModelInfer call a request, and for grpc-stream a
ModelStreamInfer stream a concurrent client, its requests one after another on it) and the
server's CPU seconds from /proc:

    server_us_per_request   every server process's CPU ÷ requests answered (with --device cuda it counts
                            the event waiter polling while a batch runs, CGSERVE_EVENT_WAIT's default:
                            cores busy ÷ rate there, not a request's own work)
    p50_ms                  the driver's own latency (its CPU is not the server's)

    PYTHONPATH=. python3 bench/grpc_cost.py --out bench/results/<name>.json [--tree DIR --label before]
        [--image-shape 3,224,224]

--image-shape other than the seed CNN's 1,28,28 serves a stand-in model of that input instead
(its forward keeps the first ten pixels: next to nothing), so that what a 150 KB body costs each
protocol shows (ResNet-50's one image, issue 26's workload).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.body_path_cost import descendants
from bench.engine_link_bench import cpu_seconds
from loadtest.server_process import free_ports, running, service_env

SEED_SHAPE = (1, 28, 28)
STAND_IN = """import torch


class FirstTen(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) → (B, 10)
        return x.flatten(1)[:, :10]


def build() -> torch.nn.Module:
    return FirstTen().eval()
"""


def model_of(shape: tuple[int, ...]) -> str:
    return "fashion-cnn" if shape == SEED_SHAPE else "stand-in"


def stand_in_repository(folder: Path, shape: tuple[int, ...]) -> Path:
    """A model repository holding one python model of input `shape` whose forward costs next to nothing."""
    model = folder / "repository" / "stand-in"
    model.mkdir(parents=True)
    (model / "model.py").write_text(STAND_IN)
    labels = ", ".join(f'"{n}"' for n in range(10))
    (model / "model.toml").write_text(
        f'format = "python"\nfactory = "model:build"\ninput_shape = {list(shape)}\ninput_datatype = "UINT8"\n'
        f"buckets = [1, 8, 32]\nlabels = [{labels}]\n"
    )
    return model.parent


def pixels_of(shape: tuple[int, ...]) -> bytes:
    return np.random.default_rng(0).integers(0, 256, (1, *shape), dtype=np.uint8).tobytes()


def http_request(port: int, shape: tuple[int, ...]) -> bytes:
    """POST /v2/models/<model>/infer, the binary extension: a JSON header, then one image's uint8 pixels."""
    pixels, model = pixels_of(shape), model_of(shape)
    header = orjson.dumps({
        "inputs": [{"name": "input", "shape": [1, *shape], "datatype": "UINT8",
                    "parameters": {"binary_data_size": len(pixels)}}],
        "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
    })  # fmt: skip
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(header) + len(pixels)}\r\n\r\n")  # fmt: skip
    return head.encode() + header + pixels


async def http_driver(port: int, concurrency: int, seconds: float, shape: tuple[int, ...]) -> list[float]:
    request, latencies = http_request(port, shape), []

    async def one_connection(until: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < until:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
        writer.close()

    until = time.perf_counter() + seconds
    await asyncio.gather(*(one_connection(until) for _ in range(concurrency)))
    return latencies


def infer_request(shape: tuple[int, ...]) -> Any:
    """One image's ModelInferRequest for the served model: its pixels as one UINT8 raw input."""
    from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb

    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, *shape])
    return pb.ModelInferRequest(model_name=model_of(shape), inputs=[tensor], raw_input_contents=[pixels_of(shape)])


async def grpc_driver(port: int, concurrency: int, seconds: float, shape: tuple[int, ...]) -> list[float]:
    import grpc

    from app.protocols.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc

    request = infer_request(shape)
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer

        async def one_stream(until: float) -> None:
            while time.perf_counter() < until:
                started = time.perf_counter()
                await infer(request)
                latencies.append(time.perf_counter() - started)

        until = time.perf_counter() + seconds
        await asyncio.gather(*(one_stream(until) for _ in range(concurrency)))
    return latencies


async def grpc_stream_driver(port: int, concurrency: int, seconds: float, shape: tuple[int, ...]) -> list[float]:
    """`concurrency` ModelStreamInfer streams on one channel, each with one request in flight (as
    perf_analyzer --streaming keeps each context's): a request written, its answer read, the next."""
    import grpc

    from app.protocols.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc

    request = infer_request(shape)
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def one_stream(until: float) -> None:
            stream = stub.ModelStreamInfer()
            while time.perf_counter() < until:
                started = time.perf_counter()
                await stream.write(request)
                answer = await stream.read()
                if answer.error_message:
                    raise RuntimeError(answer.error_message)
                latencies.append(time.perf_counter() - started)
            await stream.done_writing()

        until = time.perf_counter() + seconds
        await asyncio.gather(*(one_stream(until) for _ in range(concurrency)))
    return latencies


DRIVERS = {"http": http_driver, "grpc": grpc_driver, "grpc-stream": grpc_stream_driver}


def drive(protocol: str, port: int, concurrency: int, seconds: float, shape: tuple[int, ...]) -> None:
    """The driver process: warm up, measure, print the latencies (s) as JSON."""
    driver = DRIVERS[protocol]
    asyncio.run(driver(port, concurrency, 0.5, shape))
    print(json.dumps(asyncio.run(driver(port, concurrency, seconds, shape))))


def point(protocol: str, port: int, concurrency: int, seconds: float, server: list[int], shape: str) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--drive", protocol, "--port", str(port), "--concurrency", str(concurrency),
            "--seconds", str(seconds), "--image-shape", shape]  # fmt: skip
    # This checkout first, then whatever the caller's path holds (the H200's wheels: orjson, grpcio's extras).
    path = os.pathsep.join(filter(None, (os.getcwd(), os.environ.get("PYTHONPATH"))))
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": path})
    time.sleep(0.5)  # its warm-up: left out of the CPU figures
    before = sum(cpu_seconds(pid) for pid in server)
    output, _ = driver.communicate(timeout=60 + seconds)
    spent = sum(cpu_seconds(pid) for pid in server) - before
    latencies = json.loads(output)
    return {
        "protocol": protocol,
        "concurrency": concurrency,
        "requests_per_s": round(len(latencies) / seconds, 1),
        "server_us_per_request": round(spent / len(latencies) * 1e6, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(float(np.quantile(latencies, 0.99)) * 1000, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--tree", type=Path, help="run the server from this copy of the repository")
    p.add_argument("--label", default="this checkout")
    p.add_argument("--concurrencies", default="1,8,32")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--device", default="cpu", help="the server's CGSERVE_DEVICE (cuda: its graphs, on the H200)")
    p.add_argument("--image-shape", default="1,28,28", help="one image's C,H,W (not the seed CNN's: a stand-in model)")
    p.add_argument("--drive", choices=tuple(DRIVERS), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    shape = tuple(int(n) for n in args.image_shape.split(","))
    if args.drive:
        drive(args.drive, args.port, args.concurrency, args.seconds, shape)
        return
    port, grpc_port = free_ports(2)
    work = Path(tempfile.mkdtemp(prefix="grpc-cost-"))
    env = service_env(port, device=args.device, grpc_port=grpc_port) | {"OMP_NUM_THREADS": "1"}
    if shape != SEED_SHAPE:
        env["CGSERVE_MODEL_REPOSITORY"] = str(stand_in_repository(work, shape))
    if args.tree is not None:
        env["PYTHONPATH"] = f"{args.tree.resolve()}:{os.environ.get('PYTHONPATH', '')}"
    record: dict[str, Any] = {"command": shlex.join(["python3", *sys.argv]), "label": args.label, "points": []}
    serve = [sys.executable, "-m", "app.cli", "serve"]
    with running(serve, work / "server.log", port=port, env=env, cwd=args.tree, ready_timeout_s=120) as server:
        processes = [server.proc.pid, *descendants(server.proc.pid)]
        for concurrency in (int(c) for c in args.concurrencies.split(",")):
            for protocol, target in (("http", port), ("grpc", grpc_port), ("grpc-stream", grpc_port)):
                result = point(protocol, target, concurrency, args.seconds, processes, args.image_shape)
                record["points"].append(result)
                print(f"{args.label}: {result}", flush=True)
    for concurrency in {p["concurrency"] for p in record["points"]}:
        cost = {p["protocol"]: p["server_us_per_request"] for p in record["points"] if p["concurrency"] == concurrency}
        for protocol in ("grpc", "grpc-stream"):
            record[f"{protocol.replace('-', '_')}_over_http_cpu_c{concurrency}"] = round(
                cost[protocol] / cost["http"], 2
            )
    print({k: v for k, v in record.items() if "_over_http_" in k})
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
