"""bench/jpeg_ceiling.py's own parts on the CPU: its --decoders entries, and a point's figures from stand-ins for
the GPU decoder and the batcher (the bench itself needs a GPU and torchvision)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from app.ops import metrics
from bench import jpeg_ceiling


def test_decoder_entries_read_kind_launches_and_flags() -> None:
    entries = jpeg_ceiling.decoder_entries("tv2=torchvision:2,direct4=direct:4:pre:high")
    assert entries == {
        "tv2": {"nvjpeg": "torchvision", "launches": 2, "preallocate": None, "priority": "normal"},
        "direct4": {"nvjpeg": "direct", "launches": 4, "preallocate": (500, 375), "priority": "high"},
    }


@pytest.mark.parametrize("entry", ["x=pillow:2", "x=direct:2:fast"])
def test_an_unknown_kind_or_flag_is_refused_saying_what_is_known(entry: str) -> None:
    with pytest.raises(SystemExit, match="torchvision or direct, flags pre and high"):
        jpeg_ceiling.decoder_entries(entry)


class Decoder:
    """The GPU decoder's stand-in: a photo's pixels at once, as a future, and the decode counted."""

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, data: bytes, spec: Any) -> asyncio.Future[np.ndarray]:
        self.decoded += 1
        future = asyncio.get_running_loop().create_future()
        future.set_result(np.zeros((1, 3, 4, 4), np.uint8))
        return future


class Batcher:
    """The batcher's stand-in: every 8 submissions one batch of 8 rows, 2 ms on the device, observed as the
    batcher observes its batches."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[np.ndarray]] = []

    async def submit(self, pixels: np.ndarray) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        if len(self.waiting) == 8:
            await asyncio.sleep(0.001)
            metrics.BATCH_ROWS.labels(model="ceiling-test").observe(8)
            metrics.BATCH_COMPUTE.labels(model="ceiling-test", bucket="8").observe(0.002)
            for waiting in self.waiting:
                waiting.set_result(np.zeros((1, 10), np.float32))
            self.waiting = []
        return await future


def test_a_point_counts_the_measured_window_and_reads_the_batcher_s_histograms_over_it_alone() -> None:
    metrics.BATCH_ROWS.labels(model="ceiling-test").observe(100)  # before the point: not its batches
    decoder = Decoder()
    figures = asyncio.run(jpeg_ceiling.point(Batcher(), decoder, None, [b"photo"], clients=16, seconds=0.3))
    assert figures["clients"] == 16 and 0 < figures["images_per_s"] < decoder.decoded / 0.3
    assert figures["rows_a_batch"] == 8.0 and figures["batch_device_ms"] == 2.0
    assert figures["decoder_ms"] == {}  # no GPU decoder's histograms moved
