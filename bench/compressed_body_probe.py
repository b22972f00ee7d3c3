"""Compressed request bodies against a server's limits: its peak memory and answers for 24 JSON bodies at once
that are 16 KB gzip'd and 16 MiB inflated, and /healthz's latency while two clients send 16 MiB of zeros gzip'd.

With the bodies counted compressed, the bytes-in-flight budget let all 24 in and one inflate held the event loop
for the whole body; record: bench/results/2026-12-06-cpu-compressed-bodies.md.

    CGSERVE_MAX_INFLIGHT_BYTES=1048576 CGSERVE_DEVICE=cpu .venv/bin/cudagraph-serve serve &
    PYTHONPATH=. .venv/bin/python bench/compressed_body_probe.py --url http://127.0.0.1:8000 --pid <server pid>
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import json
import time

import httpx

GZIP = {"content-encoding": "gzip"}


def peak_mib(pid: int) -> float:
    """The server process's peak resident memory (VmHWM), MiB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


async def answers(url: str, count: int, body: bytes, headers: dict[str, str]) -> dict[str, int]:
    """`count` requests sent at once: how many ended with each status (or exception)."""
    async with httpx.AsyncClient(timeout=120) as client:
        sent = [client.post(f"{url}/predict", content=body, headers=headers) for _ in range(count)]
        done = await asyncio.gather(*sent, return_exceptions=True)
    ends = collections.Counter(str(r.status_code) if isinstance(r, httpx.Response) else type(r).__name__ for r in done)
    return dict(ends)


async def healthz_ms(url: str, client: httpx.AsyncClient) -> list[float]:
    """40 GET /healthz, 20 ms apart: each one's latency, sorted."""
    times = []
    for _ in range(40):
        started = time.perf_counter()
        await client.get(f"{url}/healthz")
        times.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.02)
    return sorted(times)


async def loop_lag(url: str) -> dict[str, object]:
    zeros = gzip.compress(bytes(16 << 20), 9)  # ~16 KB: 16 MiB of zeros, a raw body (413 past 16 MiB)
    async with httpx.AsyncClient(timeout=60) as client:
        idle = await healthz_ms(url, client)
        stop = asyncio.Event()

        async def bomber() -> int:
            sent = 0
            while not stop.is_set():
                headers = {"content-type": "application/octet-stream", **GZIP}
                await client.post(f"{url}/predict", content=zeros, headers=headers)
                sent += 1
            return sent

        bombers = [asyncio.create_task(bomber()) for _ in range(2)]
        busy = await healthz_ms(url, client)
        stop.set()
        sent = sum(await asyncio.gather(*bombers))
    return {
        "bomb_bytes": len(zeros), "bombs_sent": sent,
        "healthz_idle_ms": {"median": round(idle[20], 1), "p95": round(idle[37], 1), "max": round(idle[-1], 1)},
        "healthz_busy_ms": {"median": round(busy[20], 1), "p95": round(busy[37], 1), "max": round(busy[-1], 1)},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server process, for its peak memory")
    a = parser.parse_args()
    size = (16 << 20) - 64
    document = b'{"instances": [' + b"0," * ((size - 20) // 2) + b"0]}"
    bomb = gzip.compress(document, 9)
    before = peak_mib(a.pid)
    started = time.monotonic()
    compressed = asyncio.run(answers(a.url, 24, bomb, {"content-type": "application/json", **GZIP}))
    result = {
        "json_body": {"compressed_bytes": len(bomb), "inflated_bytes": len(document), "at_once": 24},
        "answers_compressed": compressed, "seconds": round(time.monotonic() - started, 1),
        "peak_mib_before": round(before), "peak_mib_after": round(peak_mib(a.pid)),
        "loop": asyncio.run(loop_lag(a.url)),
    }  # fmt: skip
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
