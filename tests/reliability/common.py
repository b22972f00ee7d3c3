"""What the reliability tests share: the real server on the CPU, and the load generator as a client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from models.cnn import WEIGHTS_PATH

SERVE = (sys.executable, "-m", "app.cli", "serve")

# As the issue measured it: the server on one core, the clients on the other, where there are two.
_SPLIT = shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2
SERVER_CORE, CLIENT_CORE = sorted(os.sched_getaffinity(0))[:2] if _SPLIT else (None, None)
PINNED_SERVE = ("taskset", "-c", str(SERVER_CORE), *SERVE) if _SPLIT else SERVE


def seed_with_forward(repository: Path, name: str, before_forward: str) -> Path:
    """A model repository holding one Python-format model, `name`: the seed CNN with
    `before_forward` (statements over `x`, the (N, 1, 28, 28) float batch; `time` is imported) run
    first in its forward, to make it slow or stuck on purpose. Returns the repository folder."""
    folder = repository / name
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(
        "import time\nimport torch\nfrom models.cnn import load_model\n\n\n"
        "class Wrapped(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        f"        self.inner = load_model({str(WEIGHTS_PATH)!r})\n\n    def forward(self, x):\n"
        f"{textwrap.indent(before_forward, ' ' * 8)}\n        return self.inner(x)\n\n\n"
        "def build():\n    return Wrapped().eval()\n"
    )
    (folder / "model.toml").write_text(
        'format = "python"\nfactory = "model:build"\ninput_shape = [1, 28, 28]\n'
        'labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]\n'
    )
    return repository


def on_client_core() -> None:
    """Pin the calling thread to the clients' core (a no-op where there is one core)."""
    if CLIENT_CORE is not None:
        os.sched_setaffinity(0, {CLIENT_CORE})


FIGURES_OUT = "CGSERVE_FIGURES_OUT"  # set by bench/reliability_figures.py: the file each figure is appended to


def recording_figures() -> bool:
    """Whether bench/reliability_figures.py is running these tests for their figures: runs that only give a
    figure (a baseline beside an attack) are made then, not in every test run."""
    return bool(os.environ.get(FIGURES_OUT))


def record_figure(test: str, **figures: float) -> None:
    """A speed or time figure of a run, which a test prints and never asserts: on a shared 2-core
    machine it is noise. bench/reliability_figures.py runs these tests with CGSERVE_FIGURES_OUT set
    and keeps every figure (one JSON object a line there) in its record."""
    print(f"{test}: {figures}")
    out = os.environ.get(FIGURES_OUT)
    if out:
        with open(out, "a") as lines:
            lines.write(json.dumps({"test": test, **figures}) + "\n")


def loadtest(out: Path, *args: str, timeout_s: float = 120) -> dict[str, Any]:
    """Run the project's load generator (a real HTTP client, in its own process) and read its record."""
    argv = [sys.executable, "-m", "loadtest", *args, "--out", str(out), "--quiet", "--no-check-labels"]
    if CLIENT_CORE is not None:
        argv = ["taskset", "-c", str(CLIENT_CORE), *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(out.read_text())
    return record
