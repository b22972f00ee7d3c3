"""The worker manager's look at the metrics folder (app/runtime/workers.py's forget_the_gone): the live gauges of
every process gone leave /metrics, whether or not it was ever one of uvicorn's workers (a replacement uvicorn gave
up on during a SIGHUP restart had made its files and kept cgserve_ready at 0: a review)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtime.workers import DrainingManager


def test_the_live_gauges_of_a_process_gone_are_removed_and_the_living_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(gone.stdout), os.getpid()
    names = [f"gauge_livemin_{dead}.db", f"gauge_livesum_{dead}.db", f"gauge_livemin_{alive}.db",
             f"counter_{dead}.db", f"gauge_max_{dead}.db"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    DrainingManager.forget_the_gone(object.__new__(DrainingManager))
    # Its counters and max gauges stay: they count what it did (prometheus_client's mark_process_dead keeps them).
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"gauge_livemin_{alive}.db", f"counter_{dead}.db", f"gauge_max_{dead}.db"]
    )
