"""A batch that never comes back, on the CPU: a stuck model's code, not a dead device. Its request gets 504 at its
deadline, the server stays ready for everything else, the log says the model is slow or stuck, and SIGTERM still
stops the process though the thread running the forward is stuck in it. (Before, the batch timeout declared the
CPU dead and the process exited: one slow model took every other down. A GPU's hung batch still does that:
tests/gpu/test_device_faults.py.) How many seconds the stop takes is recorded, not asserted."""

from __future__ import annotations

import signal
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


def test_a_stuck_cpu_batch_answers_504_keeps_the_server_ready_and_sigterm_still_stops_it(tmp_path: Path) -> None:
    repository = seed_with_forward(tmp_path / "repo", "stuck", HANG_ON_MARKED)
    port = free_port()
    env = {
        "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0", "CGSERVE_DEVICE": "cpu",
        "CGSERVE_MODEL_REPOSITORY": str(repository), "CGSERVE_BATCH_TIMEOUT_S": "1",
        "CGSERVE_SHUTDOWN_TIMEOUT_S": "3", "CGSERVE_DRAIN_SECONDS": "0",
    }  # fmt: skip
    marked = np.zeros((1, 1, 28, 28), dtype=np.uint8)
    marked[0, 0, 0, :4] = 255
    raw = {"content-type": "application/octet-stream"}
    with running(SERVE, tmp_path / "server.log", port=port, env=env) as server:
        assert httpx.post(f"{server.url}/predict", content=bytes(784), headers=raw).status_code == 200
        answer = httpx.post(f"{server.url}/predict", content=marked.tobytes(), timeout=30,
                            headers={**raw, "x-request-timeout-ms": "2500"})  # fmt: skip
        assert answer.status_code == 504, answer.text
        assert httpx.get(f"{server.url}/readyz").status_code == 200  # past the 1 s batch timeout: still ready
        assert server.proc.poll() is None
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            exit_code: int | None = server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            exit_code = None
        waited = time.monotonic() - started
        log = server.log_path.read_text()
    assert exit_code is not None, f"SIGTERM did not stop a server with a stuck forward within 30 s:\n{log[-3000:]}"
    assert exit_code != 0, "work was cut short: the exit says so"
    record_figure("stuck_cpu_batch_stop", stop_s=waited)  # shutdown timeout 3 s
    assert "slow or stuck" in log and "the device is dead" not in log, log[-3000:]
