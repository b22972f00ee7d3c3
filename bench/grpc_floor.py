"""grpcio's own cost, with nothing of ours: a grpc.aio server whose handlers echo bytes (issue 26.3).

What a unary call and a message on a bidirectional stream cost the server's CPU, and their round
trip at one in flight, on uvloop as the service runs: the floor under bench/grpc_cost.py's figures
(no protobuf, no data plane, no model). One server process; for each kind and concurrency a client
process sending the same body over and over on one channel, the server's CPU from /proc.

    PYTHONPATH=. python3 bench/grpc_floor.py --out bench/results/<name>.json [--body-bytes 784,150528]
        [--server-option grpc.http2.max_frame_size=4194304 ...]   (channel arguments of the server; ints as ints)
        [--server grpclib]   (the other Python gRPC server: h2 in pure Python on the event loop; pip install grpclib)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import uvloop

from bench.engine_link_bench import cpu_seconds
from loadtest.server_process import free_port

ANSWER = b"y" * 60  # about a ModelInferResponse of ten float32 scores


async def serve(port: int, options: list[tuple[str, str | int]]) -> None:
    async def unary(request: bytes, context: Any) -> bytes:
        return ANSWER

    async def stream(requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield ANSWER

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 2**20), *options])
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def serve_grpclib(port: int) -> None:
    """The same two methods on grpclib's server (no core threads: HTTP/2 parsed by h2 on the event loop)."""
    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.base import CodecBase
    from grpclib.server import Server

    class Raw(CodecBase):  # type: ignore[misc]
        __content_subtype__ = "proto"

        def encode(self, message: bytes, message_type: Any) -> bytes:
            return message

        def decode(self, data: bytes, message_type: Any) -> bytes:
            return data

    async def unary(stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(ANSWER)

    async def streamed(stream: Any) -> None:
        async for _ in stream:
            await stream.send_message(ANSWER)

    class Floor:
        def __mapping__(self) -> dict[str, Handler]:
            return {
                "/floor/Unary": Handler(unary, Cardinality.UNARY_UNARY, bytes, bytes),
                "/floor/Stream": Handler(streamed, Cardinality.STREAM_STREAM, bytes, bytes),
            }

    server = Server([Floor()], codec=Raw())
    await server.start("127.0.0.1", port)
    await server.wait_closed()


async def drive(port: int, kind: str, concurrency: int, seconds: float, body: bytes) -> list[float]:
    """Latencies (s) of `concurrency` clients on one channel: calls, or a stream each, one request in flight."""
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/floor/Unary")
        open_stream = channel.stream_stream("/floor/Stream")

        async def client(until: float) -> None:
            stream = open_stream() if kind == "stream" else None
            while time.perf_counter() < until:
                started = time.perf_counter()
                if stream is None:
                    await call(body)
                else:
                    await stream.write(body)
                    await stream.read()
                latencies.append(time.perf_counter() - started)
            if stream is not None:
                await stream.done_writing()

        await asyncio.gather(*(client(time.perf_counter() + 0.5) for _ in range(concurrency)))  # warm-up
        latencies.clear()
        await asyncio.gather(*(client(time.perf_counter() + seconds) for _ in range(concurrency)))
    return latencies


def point(port: int, server_pid: int, kind: str, concurrency: int, seconds: float, size: int) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--drive", kind, "--port", str(port), "--concurrency", str(concurrency),
            "--seconds", str(seconds), "--body-bytes", str(size)]  # fmt: skip
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # its start and warm-up: left out of the CPU figures
    before = cpu_seconds(server_pid)
    output, _ = driver.communicate(timeout=60 + seconds)
    spent = cpu_seconds(server_pid) - before
    driven = json.loads(output.strip().splitlines()[-1])
    return {
        "kind": kind, "body_bytes": size, "concurrency": concurrency,
        "requests_per_s": round(driven["answered"] / seconds, 1),
        "server_us_per_request": round(spent / driven["answered"] * 1e6, 1),
        "p50_ms": round(driven["p50_s"] * 1000, 3),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--concurrencies", default="1,8")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--body-bytes", default="784,150528", help="request sizes: the seed CNN's and ResNet-50's image")
    p.add_argument("--server-option", action="append", default=[], help="NAME=VALUE, a channel argument of the server")
    p.add_argument("--server", choices=("grpcio", "grpclib"), default="grpcio", help="the server measured")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--drive", choices=("unary", "stream"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        if args.server == "grpclib":
            uvloop.run(serve_grpclib(args.port))
        else:
            uvloop.run(serve(args.port, [_option(text) for text in args.server_option]))
        return
    if args.drive:
        body = b"x" * int(args.body_bytes)
        latencies = uvloop.run(drive(args.port, args.drive, args.concurrency, args.seconds, body))
        print(json.dumps({"answered": len(latencies), "p50_s": statistics.median(latencies)}))
        return
    port = free_port()
    options = [arg for text in args.server_option for arg in ("--server-option", text)]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--server", args.server, "--port", str(port), *options]
    )
    record: dict[str, Any] = {"command": shlex.join(["python3", *sys.argv]), "server": args.server,
                              "server_options": args.server_option, "points": []}  # fmt: skip
    try:
        time.sleep(2.0)  # listening
        for size in (int(s) for s in args.body_bytes.split(",")):
            for concurrency in (int(c) for c in args.concurrencies.split(",")):
                for kind in ("unary", "stream"):
                    result = point(port, server.pid, kind, concurrency, args.seconds, size)
                    record["points"].append(result)
                    print(result, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


def _option(text: str) -> tuple[str, str | int]:
    """ "grpc.http2.max_frame_size=4194304" → ("grpc.http2.max_frame_size", 4194304): grpc takes ints as ints."""
    name, _, value = text.partition("=")
    return name, int(value) if value.lstrip("-").isdigit() else value


if __name__ == "__main__":
    main()
