"""The container's health check (python3 -m app.runtime.healthcheck) against a real listener."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.integration.server_process import ROOT


class Readiness(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), Readiness)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def check(port: int) -> int:
    env = {"CGSERVE_PORT": str(port), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "app.runtime.healthcheck"], cwd=ROOT, env=env, timeout=30).returncode


def test_healthy_while_ready_unhealthy_at_503_or_nothing_listening(
    listener: http.server.HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = listener.server_address[1]
    assert check(port) == 0
    monkeypatch.setattr(Readiness, "status", 503)
    assert check(port) == 1
    listener.shutdown()
    listener.server_close()
    assert check(port) == 1
