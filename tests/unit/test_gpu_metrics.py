"""GPU metrics from NVML (issue 27.4): Triton's names per visible GPU, absent (not zero) without one.

NVML is a fake pynvml module here (two GPUs, or a driver that is missing): no GPU on this machine.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.ops.gpu_metrics import GpuCollector
from tests.unit.fake_nvml import UUIDS, FakeNvml


@pytest.fixture(autouse=True)
def every_gpu_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def scrape(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], float]:
    """{(metric, gpu_uuid/device): value} from a registry holding one fresh collector, as /metrics renders."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    registry = CollectorRegistry()
    registry.register(GpuCollector())
    text = generate_latest(registry).decode()
    return {
        (s.name, f"{s.labels['gpu_uuid']}/{s.labels['device']}"): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


GPU0, GPU1 = f"{UUIDS[0]}/cuda:0", f"{UUIDS[1]}/cuda:1"
EXPECTED = {
    ("nv_gpu_utilization", GPU0): 0.37,
    ("nv_gpu_utilization", GPU1): 0.90,
    ("nv_gpu_memory_total_bytes", GPU0): 80 * 2**30,
    ("nv_gpu_memory_total_bytes", GPU1): 80 * 2**30,
    ("nv_gpu_memory_used_bytes", GPU0): 2**30,
    ("nv_gpu_memory_used_bytes", GPU1): 3 * 2**30,
    ("nv_gpu_power_usage", GPU0): 123.456,
    ("nv_gpu_power_usage", GPU1): 650.0,
    ("nv_gpu_power_limit", GPU0): 700.0,
    ("nv_gpu_power_limit", GPU1): 700.0,
    ("nv_energy_consumption", GPU0): 5000.0,
    ("nv_energy_consumption", GPU1): 7500.5,
    ("nv_gpu_temperature_celsius", GPU0): 41.0,
    ("nv_gpu_temperature_celsius", GPU1): 77.0,
}


def test_every_gpu_has_each_metric_in_base_units(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scrape(FakeNvml(), monkeypatch) == pytest.approx(EXPECTED)


def test_no_nvml_means_no_series_at_all(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="app.ops.gpu_metrics"):
        assert scrape(FakeNvml(init_error="NVML Shared Library Not Found"), monkeypatch) == {}
    assert "NVML Shared Library Not Found" in caplog.text


def test_without_pynvml_installed_there_are_no_series(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scrape(None, monkeypatch) == {}  # a None in sys.modules makes `import pynvml` raise ImportError


def test_a_query_a_gpu_cannot_answer_leaves_out_that_sample_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = scrape(FakeNvml(unsupported={(1, "power"), (0, "temperature")}), monkeypatch)
    missing = {("nv_gpu_power_usage", GPU1), ("nv_gpu_temperature_celsius", GPU0)}
    assert samples == pytest.approx({k: v for k, v in EXPECTED.items() if k not in missing})


def test_a_binding_without_a_call_leaves_out_its_samples_not_the_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old `pynvml` package installs the same module without the energy call: an AttributeError, not a
    failed /metrics (a collector that raises takes every series of the scrape down)."""
    nvml = FakeNvml()
    del_energy = type("OldNvml", (FakeNvml,), {"nvmlDeviceGetTotalEnergyConsumption": property()})
    nvml.__class__ = del_energy
    samples = scrape(nvml, monkeypatch)
    assert samples == pytest.approx({k: v for k, v in EXPECTED.items() if k[0] != "nv_energy_consumption"})


def test_nvml_starts_once_and_the_text_has_triton_names_and_types(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    registry = CollectorRegistry()
    registry.register(GpuCollector())
    for _ in range(3):
        text = generate_latest(registry).decode()
    assert nvml.inits == 1
    assert "# TYPE nv_gpu_utilization gauge" in text
    assert f'nv_gpu_power_usage{{device="cuda:0",gpu_uuid="{UUIDS[0]}"}} 123.456' in text


@pytest.mark.parametrize(
    ("visible", "devices"),
    [
        (None, [(0, "cuda:0"), (1, "cuda:1")]),
        ("1", [(1, "cuda:0")]),
        ("1,0", [(1, "cuda:0"), (0, "cuda:1")]),
        (f"{UUIDS[1]},0", [(1, "cuda:0"), (0, "cuda:1")]),
        ("GPU-2222", [(1, "cuda:0")]),  # a unique prefix of a UUID, as CUDA accepts
        ("GPU-", []),  # a prefix of both: names no one GPU
        ("0,7,1", [(0, "cuda:0")]),  # CUDA stops at the first entry that names no GPU
        ("0,0", [(0, "cuda:0")]),
        ("", []),
        ("-1", []),
        ("MIG-0b1f-4c3e", []),
    ],
)
def test_cuda_visible_devices_decides_which_gpus_and_their_ordinals(
    visible: str | None, devices: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    samples = scrape(FakeNvml(), monkeypatch)
    found = sorted(key for (name, key) in samples if name == "nv_gpu_temperature_celsius")
    assert found == sorted(f"{UUIDS[i]}/{device}" for i, device in devices)
