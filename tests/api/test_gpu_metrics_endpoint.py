"""GET /metrics carries the NVML GPU series (issue 27.4) in one process and with several workers' files,
and none at all where there is no GPU. NVML is a fake (tests/unit/fake_nvml.py) but for the first test."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.main import create_app
from app.ops import metrics
from tests.unit.fake_nvml import UUIDS, FakeNvml

NV_LINE = re.compile(r"^(# (HELP|TYPE) )?nv_", re.MULTILINE)


@pytest.fixture(autouse=True)
def nvml_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's collector as before its first scrape (NVML starts once a process); put back afterwards."""
    monkeypatch.setattr(metrics.GPU, "_state", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def real_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # not installed, no driver: no GPU
        return 0


def test_without_a_gpu_metrics_has_no_nv_series_not_zeros() -> None:
    if real_gpus():
        pytest.skip("NVML sees a GPU here: the fake-NVML tests below cover the endpoint")
    with TestClient(create_app(Settings())) as client:
        text = client.get("/metrics").text
    assert "cgserve_ready" in text
    assert not NV_LINE.findall(text), "nv_ series on a machine without a GPU"


def test_metrics_has_each_gpu_with_triton_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    with TestClient(create_app(Settings())) as client:
        text = client.get("/metrics").text
    memory = {
        (s.labels["gpu_uuid"], s.labels["device"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "nv_gpu_memory_used_bytes"
        for s in f.samples
    }
    assert memory == {(UUIDS[0], "cuda:0"): 2**30, (UUIDS[1], "cuda:1"): 3 * 2**30}
    if promtool := shutil.which("promtool"):  # its lint passes Triton's names too (tests/api/test_api.py: CI has it)
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        complaints = checked.stdout + checked.stderr
        assert checked.returncode == 0 and not complaints.strip(), complaints


def test_with_several_workers_one_set_of_gpu_series(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = metrics.exposition().decode()
    assert text.count("# TYPE nv_gpu_utilization gauge") == 1
    assert len(re.findall(r"^nv_gpu_utilization\{", text, re.MULTILINE)) == 2
