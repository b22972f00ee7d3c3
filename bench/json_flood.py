"""Large JSON bodies at once against one server: its memory and how long its event loop leaves a probe waiting.

A hostile client sends `--clients` v2 JSON bodies of ~16 MiB at once, each `[[0],[0],…]` (nested one-element lists:
the most Python objects a byte of JSON makes). Each is refused 400 after its parse (too many elements), so all the
cost is the parse. Meanwhile a probe asks GET /v2/health/live every 50 ms. Printed: the server's peak RSS, the
probes answered and the slowest one.

    PYTHONPATH=. python3 bench/json_flood.py --url http://127.0.0.1:8000 --pid <server pid> [--clients 16]
"""

from __future__ import annotations

import argparse
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

BODY_BYTES = 16 * 2**20 - 200  # under CGSERVE_MAX_BODY_BYTES' default


def body() -> bytes:
    elements = (BODY_BYTES - 120) // 4
    head = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,1,28,28],"data":['
    return head + b"[0]," * (elements - 1) + b"[0]]}]}"


def rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status)[1]) // 1024  # type: ignore[index]


def send(host: str, port: int, data: bytes, answers: list[bytes]) -> None:
    with socket.create_connection((host, port), timeout=120) as connection:
        head = (f"POST /v2/models/fashion-cnn/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")  # fmt: skip
        connection.sendall(head.encode() + data)
        answers.append(connection.recv(65536).split(b"\r\n")[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--pid", type=int, required=True, help="the server process, for its RSS")
    p.add_argument("--clients", type=int, default=16)
    a = p.parse_args()
    host, port = a.url.removeprefix("http://").split(":")
    data, answers, peak, probes, done = body(), [], [rss_mb(a.pid)], [], threading.Event()
    start_rss = peak[0]

    def sample() -> None:  # every 50 ms, whatever the probe waits for
        while not done.is_set():
            peak.append(rss_mb(a.pid))
            time.sleep(0.05)

    def watch() -> None:
        while not done.is_set():
            started = time.perf_counter()
            urllib.request.urlopen(f"{a.url}/v2/health/live", timeout=60).read()
            probes.append(time.perf_counter() - started)
            time.sleep(0.05)

    watcher, sampler = threading.Thread(target=watch), threading.Thread(target=sample)
    watcher.start()
    sampler.start()
    started = time.perf_counter()
    senders = [threading.Thread(target=send, args=(host, int(port), data, answers)) for _ in range(a.clients)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    done.set()
    watcher.join()
    sampler.join()
    print(
        f"{a.clients} bodies of {len(data)} bytes: {time.perf_counter() - started:.1f} s; RSS {start_rss} MB → peak "
        f"{max(peak)} MB; probes {len(probes)}, slowest {max(probes):.2f} s; answers {sorted(set(answers))}"
    )


if __name__ == "__main__":
    main()
