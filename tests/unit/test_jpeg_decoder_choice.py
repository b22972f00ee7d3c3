"""CGSERVE_JPEG_NVJPEG=auto and CGSERVE_JPEG_LAUNCHES=0: which nvJPEG call a server's GPU decoder makes and how many
batches it launches at once, and that the front door's buffers follow the decoder actually started."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app import service as service_module
from app.config import Settings
from app.front_door.server import door_buffers
from app.service import Service


@pytest.mark.parametrize(
    ("settings", "nvjpeg"),
    [
        ({}, "torchvision"),  # JPEGs by the port alone: torchvision's, as before
        ({"front_door_port": 8002}, "direct"),  # the door in one process: the direct decoder
        ({"front_door_port": 8002, "workers": 2, "engine_process": True}, "torchvision"),  # the workers' multipart
        ({"engine_process": True}, "torchvision"),
        ({"front_door_port": 8002, "jpeg_nvjpeg": "torchvision"}, "torchvision"),  # said: kept
        ({"jpeg_nvjpeg": "direct"}, "direct"),
    ],
)
def test_auto_decides_the_nvjpeg_call(settings: dict[str, Any], nvjpeg: str) -> None:
    assert Settings(**settings).nvjpeg == nvjpeg


def test_the_service_asks_for_the_decided_call_and_the_launches_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first cut passed jpeg_nvjpeg on as it was: "auto" reached the decoder, which knows only direct and
    torchvision."""
    asked: dict[str, Any] = {}

    def start(setting: str, device: str, **options: Any) -> None:
        asked.update(options)

    monkeypatch.setattr(service_module, "start_jpeg_decoder", start)
    asyncio.run(Service(Settings(front_door_port=8002))._start_jpeg_decoder("gpu", "cuda:0"))
    assert (asked["nvjpeg"], asked["launches"]) == ("direct", 0)  # 0: the decoder started says how many


def test_the_doors_buffers_follow_the_decoders_launches() -> None:
    """One bulk a batch in flight, one filling; where a GPU decoder paces the door's bulks of JPEGs, two a launch and
    one more. A review found a first cut counting the launches from the settings: 3 for the direct decoder asked
    for, where a GPU without JPEG engines had started torchvision's at 2."""
    settings = Settings(front_door_port=8002)
    assert door_buffers(settings, paced_launches=3) == settings.in_flight + 1 + 2 * 3 + 1
    assert door_buffers(settings, paced_launches=2) == settings.in_flight + 1 + 2 * 2 + 1
    assert door_buffers(settings, paced_launches=0) == settings.in_flight + 1
