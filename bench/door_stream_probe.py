"""ModelStreamInfer calls that write one message, then read, on grpcio's aio client: the status each ends with.

The front door refuses the call (UNIMPLEMENTED: the service's gRPC port serves streams). Refused at its headers,
the status raced the client's first write, which then reported INTERNAL ("Internal error from Core"); record:
bench/results/2026-12-06-cpu-door-stream-refusal.md.

    PYTHONPATH=. .venv/bin/python bench/door_stream_probe.py 127.0.0.1:<door gRPC port> 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections

import grpc

METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
MESSAGE = b"\x0a\x0bfashion-cnn"  # a ModelInferRequest naming the seed CNN: what it holds does not matter here


async def statuses(address: str, calls: int) -> dict[str, int]:
    """How many of `calls` calls, one after another on one channel, ended with each status."""
    codes: collections.Counter[str] = collections.Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stream = channel.stream_stream(METHOD)
        for _ in range(calls):
            call = stream(timeout=10)
            try:
                await call.write(MESSAGE)
                await call.read()
            except grpc.aio.AioRpcError:
                pass  # the status is the call's, below
            codes[(await call.code()).name] += 1
    return dict(codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of the front door's gRPC listener")
    parser.add_argument("calls", type=int)
    args = parser.parse_args()
    print(asyncio.run(statuses(args.address, args.calls)))


if __name__ == "__main__":
    main()
