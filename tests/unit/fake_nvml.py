"""A fake pynvml for the GPU-metrics tests: two GPUs, or a driver that is missing, on any machine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

UUIDS = ("GPU-11111111-aaaa-bbbb-cccc-000000000000", "GPU-22222222-aaaa-bbbb-cccc-000000000000")


class NVMLError(Exception):  # pynvml's base class of every NVML failure
    pass


class FakeNvml:
    """The part of pynvml the collector calls: two GPUs, NVML's own units (percent, milliwatts, mJ)."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *, init_error: str | None = None, unsupported: set[tuple[int, str]] | None = None) -> None:
        self.init_error = init_error
        self.unsupported = unsupported or set()  # (gpu index, pynvml function) that raises
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return UUIDS[handle]

    def _answer(self, handle: int, function: str, value: Any) -> Any:
        if (handle, function) in self.unsupported:
            raise NVMLError("Not Supported")
        return value

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return self._answer(handle, "utilization", SimpleNamespace(gpu=[37, 90][handle], memory=5))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used = [1 << 30, 3 << 30][handle]
        return self._answer(handle, "memory", SimpleNamespace(total=80 << 30, used=used, free=(80 << 30) - used))

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._answer(handle, "power", [123_456, 650_000][handle])

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        return self._answer(handle, "power_limit", 700_000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._answer(handle, "energy", [5_000_000, 7_500_500][handle])

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._answer(handle, "temperature", [41, 77][handle])
