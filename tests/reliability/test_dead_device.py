"""A batch that never comes back, on the CPU: its request gets 503, readiness turns 503, and the
process exits non-zero — though the thread running the forward is still stuck in it. How many seconds
it takes (the batch timeout and the shutdown timeout, 5 s here) is recorded, not asserted."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import numpy as np

from loadtest.server_process import free_port, running
from tests.reliability.common import SERVE, record_figure, seed_with_forward

HANG_ON_MARKED = """\
if bool((x[:, 0, 0, :4] == 1.0).all(dim=1).any()):  # the first four pixels 255: hang
    time.sleep(600)"""  # kept: a forward that never returns is the behaviour under test


def test_a_hung_batch_answers_503_and_the_process_exits_non_zero(tmp_path: Path) -> None:
    repository = seed_with_forward(tmp_path / "repo", "stuck", HANG_ON_MARKED)
    port = free_port()
    env = {
        "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0", "CGSERVE_DEVICE": "cpu",
        "CGSERVE_MODEL_REPOSITORY": str(repository), "CGSERVE_BATCH_TIMEOUT_S": "2",
        "CGSERVE_SHUTDOWN_TIMEOUT_S": "3", "CGSERVE_DRAIN_SECONDS": "0",
    }  # fmt: skip
    marked = np.zeros((1, 1, 28, 28), dtype=np.uint8)
    marked[0, 0, 0, :4] = 255
    raw = {"content-type": "application/octet-stream"}
    with running(SERVE, tmp_path / "server.log", port=port, env=env) as server:
        assert httpx.post(f"{server.url}/predict", content=bytes(784), headers=raw).status_code == 200
        started = time.monotonic()
        answer = httpx.post(f"{server.url}/predict", content=marked.tobytes(), headers=raw, timeout=30)
        assert answer.status_code == 503 and "dead" in answer.json()["error"]["message"], answer.text
        try:
            exit_code: int | None = server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            exit_code = None
        waited = time.monotonic() - started
        log = server.log_path.read_text()
    assert exit_code not in (None, 0), f"no non-zero exit within 30 s:\n{log[-3000:]}"
    record_figure("dead_device_exit", exit_s=waited)  # batch timeout 2 s + shutdown timeout 3 s; was < 10
    assert "the device is dead" in log
