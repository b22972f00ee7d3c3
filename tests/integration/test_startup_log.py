"""What the real server's start-up log tells an operator: where to reach it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.integration.server_process import running_server

SERVE = (sys.executable, "-m", "app.cli", "serve")


def test_the_start_up_log_names_the_http_address_once(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with running_server(log, command=SERVE, device="cpu") as url:
        lines = [line for line in log.read_text().splitlines() if "HTTP on " in line]
    assert len(lines) == 1, lines
    assert f"HTTP on {url} " in lines[0], lines[0]  # scheme, host and port, as a client dials it
