"""Per-GPU utilisation, memory, power, energy and temperature, read from NVML when /metrics is scraped.

Triton's names and units (nv_gpu_utilization 0..1, nv_gpu_memory_used_bytes, nv_gpu_power_usage in
watts …), so that the dashboards and alerts operators keep for Triton read ours unchanged. Labels:
gpu_uuid, as Triton's; device, this process's CUDA ordinal (cuda:0 …), to join with cgserve_device_*.

Absent, not zero: without nvidia-ml-py, without the driver's libnvidia-ml, or with no GPU visible,
collect() yields nothing, so a CPU replica has no nv_ series (a 0 would read as an idle GPU). A query
one GPU cannot answer (power on some boards) leaves out that sample alone.

Which GPUs: the ones CUDA gives this process. CUDA_VISIBLE_DEVICES unset: every GPU NVML sees,
cuda:i being NVML's index i. Set: its entries in order, each an index or a GPU UUID (or a unique
prefix of one); as CUDA does, reading stops at the first entry that names no GPU (or one already
named), so "" and "-1" mean none. Indexes are NVML's, in PCI bus order: CUDA's own order where
CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are alike; UUIDs are exact. MIG instances are not reported.

NVML starts once per process, at the first scrape (a lock makes it once when scrapes race); every
scrape then costs a handful of driver calls per GPU, on the metrics thread (app/ops/metrics.py).
With several workers, whichever one answers a scrape reads the GPUs itself: one set of series.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

_log = logging.getLogger(__name__)

LABELS = ("gpu_uuid", "device")

# (name, help, read(nvml, handle) → value in base units). Triton's help texts where Triton has the metric.
_READS: tuple[tuple[str, str, Callable[[Any, Any], float]], ...] = (
    (
        "nv_gpu_utilization",
        "GPU utilization rate [0.0 - 1.0)",
        lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100,  # NVML: percent
    ),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).total),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used),
    ("nv_gpu_power_usage", "GPU power usage in watts", lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000),  # mW
    (
        "nv_gpu_power_limit",
        "GPU power management limit in watts",
        lambda nvml, h: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,  # mW
    ),
    # Triton counts from its own start; NVML's total runs from the driver's load, so that the value does
    # not depend on which worker answers the scrape. rate() and increase() read both alike. A gauge here
    # only because prometheus_client would rename a counter nv_energy_consumption_total.
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the driver was loaded (monotonic: use rate or increase)",
        lambda nvml, h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000,  # mJ
    ),
    # Triton exports no temperature (DCGM's exporter calls it DCGM_FI_DEV_GPU_TEMP): Triton's prefix,
    # the unit in the name as Prometheus' naming guide asks.
    (
        "nv_gpu_temperature_celsius",
        "GPU core temperature, in degrees Celsius",
        lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
    ),
)


@dataclass(frozen=True)
class Gpu:
    handle: Any  # NVML's device handle
    uuid: str  # GPU-…
    device: str  # cuda:N, this process's ordinal


class GpuCollector:
    """A prometheus_client collector: register it once on each registry that renders /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (the pynvml module, the visible GPUs) once NVML was tried; None before. One attribute, so
        # that a test can put it back as it was.
        self._state: tuple[Any, list[Gpu]] | None = None
        self._unanswered: set[tuple[str, str]] = set()  # (uuid, metric) a GPU could not answer, logged once

    def describe(self) -> Iterator[Metric]:
        """The families, without samples: what a registry checks for clashes (it calls no NVML)."""
        for name, help_text, _ in _READS:
            yield GaugeMetricFamily(name, help_text, labels=LABELS)

    def collect(self) -> Iterator[Metric]:
        nvml, gpus = self._started()
        if not gpus:
            return
        for name, help_text, read in _READS:
            family = GaugeMetricFamily(name, help_text, labels=LABELS)
            for gpu in gpus:
                try:
                    family.add_metric([gpu.uuid, gpu.device], read(nvml, gpu.handle))
                except Exception as error:  # NVMLError, or another binding's missing call: this sample alone
                    self._note_unanswered(gpu.uuid, name, error)
            if family.samples:
                yield family

    def _started(self) -> tuple[Any, list[Gpu]]:
        with self._lock:
            if self._state is None:
                self._state = _start()
            return self._state

    def _note_unanswered(self, uuid: str, name: str, error: Exception) -> None:
        if (uuid, name) not in self._unanswered:
            self._unanswered.add((uuid, name))
            _log.info("GPU metrics: %s left out for %s, NVML answered: %s", name, uuid, error)


def _start() -> tuple[Any, list[Gpu]]:
    """nvmlInit and the visible GPUs; (None, []) with the reason logged where there are none."""
    try:
        import pynvml
    except ImportError:
        _log.info("GPU metrics off: nvidia-ml-py (pynvml) is not installed")
        return None, []
    try:
        pynvml.nvmlInit()
        gpus = visible_gpus(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except Exception as error:  # NVMLError, or a pynvml module of another make: no GPU series, never a failed scrape
        _log.info("GPU metrics off: NVML did not start (%s); no nv_gpu_ series", error)
        return None, []
    if gpus:
        _log.info("GPU metrics on: %s", ", ".join(f"{g.device}={g.uuid}" for g in gpus))
    else:
        _log.info("GPU metrics off: NVML sees no GPU visible to this process; no nv_gpu_ series")
    return pynvml, gpus


def visible_gpus(nvml: Any, cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA gives a process with this CUDA_VISIBLE_DEVICES, as cuda:0, cuda:1 … (module docstring)."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    chosen: list[int] = []
    for entry in range(len(handles)) if cuda_visible_devices is None else cuda_visible_devices.split(","):
        index = entry if isinstance(entry, int) else _index(entry.strip(), uuids)
        if index is None or index in chosen:
            break
        chosen.append(index)
    return [Gpu(handles[i], uuids[i], f"cuda:{n}") for n, i in enumerate(chosen)]


def _index(entry: str, uuids: list[str]) -> int | None:
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry.startswith("GPU-"):
        matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None  # MIG-…, a negative index, anything else


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older pynvml releases answered bytes
