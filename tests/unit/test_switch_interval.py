"""Every serving process sets its GIL switch interval from the settings (app/ops/switch_interval.py says why)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest

from app.config import DEFAULT_REPOSITORY, Settings
from app.service import Service


@pytest.fixture(autouse=True)
def restore_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize(("setting", "expected_s"), [({}, 0.001), ({"switch_interval_ms": 2.5}, 0.0025)])
def test_a_started_service_sets_its_process_switch_interval(setting: dict[str, float], expected_s: float) -> None:
    sys.setswitchinterval(0.005)  # CPython's default

    async def scenario() -> None:
        service = Service(Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", **setting))
        service.start()
        try:
            assert sys.getswitchinterval() == pytest.approx(expected_s)
            await service.wait_started()
        finally:
            await service.stop()

    asyncio.run(scenario())


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="switch_interval_ms"):
        Settings(switch_interval_ms=0)
