"""One client pipelining GET /healthz without reading its answers: the server's memory, and a second
client's wait, while it floods (a review's attack on uvicorn's pipeline, which queued every head a
read held; app/http/protocol.py MAX_PIPELINED bounds it).

    PYTHONPATH=. python3 bench/pipelined_flood.py [--seconds 15] [--tree DIR] [--label NAME] [--out FILE]

The service on the CPU, one worker, gRPC off. The flooder writes 29,959 heads (~1 MiB) at a time on
one connection and reconnects when the server closes it; meanwhile a second client asks /healthz
once a second on a connection of its own. Records the server's RSS before and at the end, and the
second client's waits. --tree runs the server from another checkout (PYTHONPATH first), so that a
tree before the bound and this one are measured in one run on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from loadtest.server_process import HOST, free_port, running, service_env

HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
FLOOD = HEAD * 29_959  # ~1 MiB a write


def rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def flood(port: int, until: float, writes: list[int]) -> None:
    while time.monotonic() < until:
        try:
            with socket.create_connection((HOST, port), timeout=5) as connection:
                while time.monotonic() < until:
                    connection.sendall(FLOOD)
                    writes[0] += 1
        except OSError:
            pass  # closed by the server (the bound's 429) or a write timed out: connect again


def one_healthz(port: int) -> float:
    """Seconds until a lone /healthz on its own connection is answered."""
    started = time.monotonic()
    with socket.create_connection((HOST, port), timeout=30) as connection:
        connection.sendall(HEAD)
        connection.recv(4096)
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--tree", type=Path, default=None, help="a checkout whose app/ the server runs")
    p.add_argument("--label", default="this tree")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    port = free_port()
    env = service_env(port, device="cpu", workers=1)
    if args.tree is not None:
        env["PYTHONPATH"] = f"{args.tree.resolve()}:{os.environ.get('PYTHONPATH', '')}"
    log = Path(tempfile.mkdtemp(prefix="flood-")) / "server.log"
    serve = [sys.executable, "-m", "app.cli", "serve"]
    with running(serve, log, port=port, env=env, cwd=args.tree) as server:
        time.sleep(2.0)  # past start-up's own allocations
        before = rss_mb(server.proc.pid)
        writes = [0]
        flooder = threading.Thread(target=flood, args=(port, time.monotonic() + args.seconds, writes))
        flooder.start()
        waits = []
        while flooder.is_alive():
            time.sleep(1.0)
            waits.append(round(one_healthz(port) * 1000, 1))
        flooder.join()
        after = rss_mb(server.proc.pid)
    record = {
        "command": shlex.join(["python3", *sys.argv]),
        "label": args.label,
        "rss_mb_before": before,
        "rss_mb_after": after,
        "flood_writes": writes[0],
        "healthz_waits_ms": waits,
    }
    print(f"{args.label}: RSS {before} → {after} MB over {args.seconds:g} s; {writes[0]} writes of "
          f"{len(FLOOD) // len(HEAD)} heads; a lone /healthz meanwhile: max {max(waits)} ms", flush=True)  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
