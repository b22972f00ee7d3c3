"""Real device faults in a real server process: the batch fails, readiness turns 503, the process exits non-zero.

Two faults, each triggered by a marked request (its first four pixels 255): a device-side assert
raised inside a captured graph's kernel (an index out of range), and a batch that never finishes
(torch.cuda._sleep). Each server has its own tiny repository: the seed CNN behind a trap.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.server_process import free_port, running
from models.cnn import WEIGHTS_PATH

SERVE = (sys.executable, "-m", "app.cli", "serve")
TRAPS = {
    # An index far out of range for the marked rows: the gather kernel's bounds assert fires inside the graph.
    "assert": (
        "cuda-graph",
        "        idx = marked.long() * 1_000_000  # (B,)\n"
        "        return self.inner(x) + self.table[idx][:, None] * 0\n",
    ),
    # A kernel that spins for minutes: the batch is never done (eager engine: the check syncs on the host).
    "hang": (
        "eager",
        "        if bool(marked.any()):\n            torch.cuda._sleep(2**40)\n        return self.inner(x)\n",
    ),
}
MODEL_PY = """import torch
from models.cnn import FashionCNN, load_model


class Trap(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = load_model({weights!r})
        self.register_buffer("table", torch.zeros(1))

    def forward(self, x):
        marked = (x[:, 0, 0, :4] == 1.0).all(dim=1)  # (B,): the first four pixels are 255
{body}

def build():
    return Trap().eval()
"""


def repository(root: Path, fault: str) -> Path:
    engine, body = TRAPS[fault]
    folder = root / "trap"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(MODEL_PY.format(weights=str(WEIGHTS_PATH), body=body))
    (folder / "model.toml").write_text(
        f'format = "python"\nfactory = "model:build"\ninput_shape = [1, 28, 28]\nengine = "{engine}"\n'
        'compile = "none"\nlabels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]\n'
    )
    return root


@pytest.mark.parametrize("fault", list(TRAPS))
def test_a_device_fault_fails_its_batch_turns_readiness_off_and_exits_non_zero(tmp_path: Path, fault: str) -> None:
    port = free_port()
    env = {
        "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0", "CGSERVE_DEVICE": "cuda",
        "CGSERVE_MODEL_REPOSITORY": str(repository(tmp_path / "repo", fault)), "CGSERVE_BUCKETS": "1,8",
        "CGSERVE_BATCH_TIMEOUT_S": "3", "CGSERVE_SHUTDOWN_TIMEOUT_S": "5", "CGSERVE_DRAIN_SECONDS": "0",
    }  # fmt: skip
    raw = {"content-type": "application/octet-stream"}
    clean = np.zeros((1, 1, 28, 28), dtype=np.uint8)
    marked = clean.copy()
    marked[0, 0, 0, :4] = 255
    with running(SERVE, tmp_path / "server.log", port=port, env=env, ready_timeout_s=300) as server:
        assert httpx.post(f"{server.url}/predict", content=clean.tobytes(), headers=raw).status_code == 200
        answer = httpx.post(f"{server.url}/predict", content=marked.tobytes(), headers=raw, timeout=30)
        assert answer.status_code in (500, 503), answer.text
        try:
            readiness = httpx.get(f"{server.url}/readyz", timeout=2).status_code
        except httpx.TransportError:
            readiness = None  # already gone: also not ready
        assert readiness in (503, None)
        deadline = time.monotonic() + 30
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        exit_code = server.proc.poll()
        log = server.log_path.read_text()
    assert exit_code not in (None, 0), f"the process did not exit non-zero within 30 s:\n{log[-3000:]}"
    assert "the device is dead" in log, log[-3000:]
