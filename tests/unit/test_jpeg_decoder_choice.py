"""CGSERVE_JPEG_NVJPEG=auto and CGSERVE_JPEG_LAUNCHES=0: which nvJPEG call and how many launches a server's GPU
decoder gets, and that the service and the front door's buffers both take the decided values."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app import service as service_module
from app.config import Settings
from app.front_door.server import door_buffers
from app.service import Service


@pytest.mark.parametrize(
    ("settings", "nvjpeg", "launches"),
    [
        ({}, "torchvision", 2),  # JPEGs by the port alone: torchvision's, as before
        ({"front_door_port": 8002}, "direct", 3),  # the door in one process: the direct decoder, 3 launches
        ({"front_door_port": 8002, "workers": 2, "engine_process": True}, "torchvision", 2),  # workers' multipart
        ({"engine_process": True}, "torchvision", 2),
        ({"front_door_port": 8002, "jpeg_nvjpeg": "torchvision"}, "torchvision", 2),  # said: kept
        ({"jpeg_nvjpeg": "direct"}, "direct", 3),
        ({"front_door_port": 8002, "jpeg_launches": 5}, "direct", 5),
        ({"jpeg_launches": 1}, "torchvision", 1),
    ],
)
def test_auto_decides_the_decoder_and_its_launches(settings: dict[str, Any], nvjpeg: str, launches: int) -> None:
    chosen = Settings(**settings)
    assert (chosen.nvjpeg, chosen.decoder_launches) == (nvjpeg, launches)


def test_the_service_and_the_doors_buffers_take_the_decided_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first cut passed the raw settings on: "auto" reached the decoder, and the door counted 0 launches' buffers."""
    asked: dict[str, Any] = {}

    def start(setting: str, device: str, **options: Any) -> None:
        asked.update(options)

    monkeypatch.setattr(service_module, "start_jpeg_decoder", start)
    settings = Settings(front_door_port=8002)
    asyncio.run(Service(settings)._start_jpeg_decoder("gpu", "cuda:0"))
    assert (asked["nvjpeg"], asked["launches"]) == ("direct", 3)
    # One bulk a batch in flight, one filling, and 2 a launch and one more for the bulks the decoder paces.
    assert door_buffers(settings, paced=True) == settings.in_flight + 1 + 2 * 3 + 1
    assert door_buffers(settings, paced=False) == settings.in_flight + 1
