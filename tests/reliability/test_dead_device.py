"""A batch that never comes back, on the CPU: its request gets 503, readiness turns 503, and the
process exits non-zero in seconds — though the thread running the forward is still stuck in it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np

from loadtest.server_process import free_port, running
from models.cnn import WEIGHTS_PATH
from tests.reliability.common import SERVE

MODEL_PY = f"""import time
import torch
from models.cnn import load_model


class Stuck(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = load_model({str(WEIGHTS_PATH)!r})

    def forward(self, x):
        if bool((x[:, 0, 0, :4] == 1.0).all(dim=1).any()):  # the first four pixels 255: hang
            time.sleep(600)
        return self.inner(x)


def build():
    return Stuck().eval()
"""


def test_a_hung_batch_answers_503_and_the_process_exits_non_zero(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "stuck"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(MODEL_PY)
    (folder / "model.toml").write_text(
        'format = "python"\nfactory = "model:build"\ninput_shape = [1, 28, 28]\n'
        'labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]\n'
    )
    port = free_port()
    env = {
        "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0", "CGSERVE_DEVICE": "cpu",
        "CGSERVE_MODEL_REPOSITORY": str(folder.parent), "CGSERVE_BATCH_TIMEOUT_S": "2",
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
        while server.proc.poll() is None and time.monotonic() - started < 30:
            time.sleep(0.1)
        exit_code, waited = server.proc.poll(), time.monotonic() - started
        log = server.log_path.read_text()
    assert exit_code not in (None, 0), f"no non-zero exit within 30 s:\n{log[-3000:]}"
    assert waited < 2 + 3 + 5, f"exited after {waited:.1f} s"  # batch timeout + shutdown timeout + slack
    assert "the device is dead" in log
