"""bench/side_by_side.py end to end on the CPU: the seed CNN through ours (eager), the naive
server and LitServe, with tiny steps; the JSON record and the README's table come out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("litserve", reason="the LitServe comparison needs .venv/bin/pip install -e '.[compare]'")
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_one_run_measures_every_server_on_the_same_checked_load(tmp_path: Path) -> None:
    argv = [
        sys.executable, str(ROOT / "bench/side_by_side.py"), "--out", str(tmp_path), "--model", "fashion-cnn",
        "--servers", "cuda-graph,eager,naive,litserve", "--concurrencies", "2,4", "--rate", "10",
        "--step-duration", "1", "--warmup", "0.3", "--processes", "1", "--no-pin",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    report = json.loads((tmp_path / "side-by-side-fashion-cnn.json").read_text())
    servers = report["servers"]
    assert list(servers) == ["cuda-graph", "eager", "naive", "litserve"]
    assert servers["cuda-graph"] == {"role": "ours: CUDA graphs of inductor's kernels", "skipped": "no CUDA device"}
    for name in ("eager", "naive", "litserve"):
        record = servers[name]
        steps = record["closed_loop"] + record["open_loop"]
        assert [s.get("concurrency") for s in steps] == [2, 4, None] and record["open_loop"][0]["target_rate_rps"] == 10
        # Every answer of every step carried the eager model's labels: the same load, answered alike.
        assert all(s["labels_checked"] and s["counts"]["errors"] == 0 for s in steps), name
        assert record["saturation"]["throughput_rps"] > 0 and record["exit_code_before_stop"] is None
    assert report["settings"]["form"] == "raw" and report["settings"]["labels_checked"]
    table = (tmp_path / "side-by-side-fashion-cnn.md").read_text()
    assert "| litserve | LitServe 0.2.19, batching on |" in table and "| naive | one request, one forward |" in table
