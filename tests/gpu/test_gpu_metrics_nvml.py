"""The NVML series (issue 27.4) from the real driver: /metrics names this GPU by its UUID, its memory
total is CUDA's, the used bytes grow with what this process allocates, and every series has a sane
value. The CPU tests drive the same collector with a fake NVML (tests/unit/fake_nvml.py)."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.main import create_app
from app.ops import metrics

NAMES = (
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
    "nv_gpu_temperature_celsius",
)


def series(client: TestClient) -> dict[str, dict[str, float]]:
    """name → {device label: value} for the nv_ families of one scrape."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("nv_"):
                found.setdefault(sample.name, {})[sample.labels["device"]] = sample.value
                assert sample.labels["gpu_uuid"].startswith("GPU-"), sample
    return found


def test_the_real_gpu_in_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics.GPU, "_state", None)  # NVML started afresh, in this test
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _, total = torch.cuda.mem_get_info(0)  # this process's CUDA context exists before the first scrape
    with TestClient(create_app(Settings(device="cpu"))) as client:  # the series do not need a GPU model
        before = series(client)
        assert set(NAMES) <= set(before), f"missing: {set(NAMES) - set(before)}"
        assert set(before["nv_gpu_memory_total_bytes"]) == {f"cuda:{i}" for i in range(torch.cuda.device_count())}
        nvml_total = before["nv_gpu_memory_total_bytes"]["cuda:0"]
        assert 0.97 * nvml_total <= total <= nvml_total, (total, nvml_total)  # CUDA's total leaves the driver's share
        assert 0.0 <= before["nv_gpu_utilization"]["cuda:0"] <= 1.0
        assert 20 <= before["nv_gpu_power_usage"]["cuda:0"] <= before["nv_gpu_power_limit"]["cuda:0"] * 1.2
        assert 10 <= before["nv_gpu_temperature_celsius"]["cuda:0"] <= 100
        block = torch.empty(2**30, dtype=torch.uint8, device="cuda:0")  # 1 GiB this process now holds
        torch.cuda.synchronize()
        after = series(client)
        grown = after["nv_gpu_memory_used_bytes"]["cuda:0"] - before["nv_gpu_memory_used_bytes"]["cuda:0"]
        assert 2**30 <= grown <= 2**30 + 256 * 2**20, grown  # the block, and the allocator's rounding
        assert after["nv_energy_consumption"]["cuda:0"] >= before["nv_energy_consumption"]["cuda:0"]
        del block
