"""The SLO tuner on a real GPU: the graph engine's batches timed in process, and the whole
`cudagraph-serve tune` with the real server's overhead, on the seed CNN (no compile: quick)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.config import Settings
from app.engines.cuda import CudaEngine
from app.tuning.measure import measure_replays
from models.cnn import load_model
from tests.gpu.test_cuda_engine import DEVICE
from tests.integration.server_process import ROOT
from tests.seed_model import seed_spec


def test_every_bucket_of_a_graph_engine_is_timed_through_its_full_path() -> None:
    engine = CudaEngine(load_model(), seed_spec(), (1, 8, 64), device=DEVICE)
    try:
        table = measure_replays(engine, dtype="uint8", runs=30)
    finally:
        engine.close()
    assert sorted(table) == [1, 8, 64]
    for bucket, timing in table.items():
        assert 0 < timing.median_s <= timing.p99_s < 1.0, (bucket, timing)


def test_tune_on_the_gpu_writes_settings_the_service_reads(tmp_path: Path) -> None:
    env_file, report_file = tmp_path / "tuned.env", tmp_path / "tune.json"
    argv = [sys.executable, "-m", "app.cli", "tune", "--slo-p99-ms", "20", "--device", "cuda", "--compile", "none"]
    argv += ["--max-bucket", "32", "--runs", "30", "--overhead-requests", "50"]
    argv += ["--out", str(env_file), "--json", str(report_file)]
    # ROOT first, then whatever the caller's PYTHONPATH holds (the GPU machine's wheels live there).
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    result = subprocess.run(argv, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)
    report = json.loads(report_file.read_text())
    assert report["engine"] == {"engine": "cuda-graph", "device": "cuda:0", "dtype": "fp32"}
    assert sorted(map(int, report["replay"])) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert report["overhead"]["source"].startswith("measured")
    settings = Settings(_env_file=env_file)  # type: ignore[call-arg]
    assert settings.buckets == tuple(report["chosen"]["buckets"])
    assert settings.max_delay_ms == report["chosen"]["max_delay_ms"]
    assert report["chosen"]["worst_p99_ms"] <= 20
