"""The real app with a stand-in engine: measures the HTTP path on any machine, GPU or not.

Every batch completes `--batch-us` after launch (a timer, as a GPU batch would: the event loop
is free meanwhile), so what a load generator measures against it is the service's own CPU cost
per request: HTTP, decode, batcher, hand-back, encode, metrics. The service's settings apply
(CGSERVE_INLINE_PREDICT=false: every request through the ASGI routes).

    python bench/proxy_server.py --port 8000 [--batch-us 80]
    hey -z 6s -c 64 -m POST -T application/json -D body.json http://127.0.0.1:8000/predict
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn

from app import service as service_module
from app.config import Settings
from app.engines.base import EngineReport, InputDtype, Slot, host_slot
from app.http.server import uvicorn_options
from app.main import create_app


class TimerEngine:
    name = "stand-in"
    device = "cpu"

    def __init__(self, batch_s: float, buckets: tuple[int, ...], in_flight: int) -> None:
        self.batch_s = batch_s
        self.buckets = buckets
        self.slots = tuple(host_slot(i, buckets[-1], (1, 28, 28), 10) for i in range(in_flight))
        self.report = EngineReport()

    async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        loop.call_later(self.batch_s, done.set_result, None)
        await done
        return self.batch_s

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--batch-us", type=float, default=80.0)
    args = parser.parse_args()
    settings = Settings(port=args.port, grpc_port=0)  # type: ignore[call-arg]
    service_module.build_engine = lambda model, options, *, in_flight, **_: TimerEngine(  # type: ignore[assignment]
        args.batch_us / 1e6, options.buckets, in_flight
    )
    options = uvicorn_options(settings) | {"log_level": "warning"}  # the service's protocol and limits
    uvicorn.run(create_app(settings), host="127.0.0.1", port=args.port, **options)


if __name__ == "__main__":
    main()
