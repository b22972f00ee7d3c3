"""The real server as README starts it (`make serve`), with CGSERVE_* settings, through the
shared harness (loadtest/server_process.py). tests/gpu uses it too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from app.ops.metric_buffers import FLUSH_S
from loadtest.server_process import HOST, free_ports, running
from loadtest.server_process import free_port as free_port  # the tests' own picks import it from here

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
README_COMMAND = ("make", "--no-print-directory", "serve")


@contextmanager
def running_server(log_path: Path, command: tuple[str, ...] = README_COMMAND, **settings: str) -> Iterator[str]:
    """Run `command` (README's by default) on a free loopback port; its URL once /readyz answers 200."""
    # gRPC on a port of its own too: servers that overlap in a test session must not share 8001. A gRPC
    # port the caller picked (settings' grpc_port) is not the HTTP port either.
    port, grpc_port = [p for p in free_ports(3) if str(p) != settings.get("grpc_port")][:2]
    env = {"CGSERVE_HOST": HOST, "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": str(grpc_port)}
    # A stop's drain (readiness 503 while requests are still served, for load balancers) kept for 0.1 s, not the
    # default 5: every server a test starts is stopped, and the suite's waits came to minutes of CI. The drain's
    # own tests set drain_seconds.
    env["CGSERVE_DRAIN_SECONDS"] = "0.1"
    env |= {f"CGSERVE_{name.upper()}": value for name, value in settings.items()}
    with running(command, log_path, port=port, ready_timeout_s=START_TIMEOUT_S, env=env, cwd=ROOT) as server:
        yield server.url


def requests_counted(metrics: str, labels: str) -> float:
    """cgserve_requests_total's first series whose labels hold each of `labels` (comma-separated `name="value"`)."""
    line = next((line for line in metrics.splitlines() if line.startswith("cgserve_requests_total{") and
                 all(label in line for label in labels.split(","))), None)  # fmt: skip
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def settled_metrics(url: str) -> str:
    """/metrics once every process of a server has flushed its buffered figures (app/ops/metric_buffers.py):
    the worker that answers flushes its own at once, the others and an engine process each FLUSH_S."""
    time.sleep(3 * FLUSH_S)
    return httpx.get(f"{url}/metrics").text
