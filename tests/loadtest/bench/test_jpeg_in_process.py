"""bench/jpeg_in_process.py's own parts on the CPU: its --decoders entries, and a point's figures from stand-ins for
the GPU decoder and the batcher (the bench itself needs a GPU and torchvision)."""

from __future__ import annotations

import asyncio
import functools
import shutil
import types
from typing import Any

import numpy as np
import pytest

from app.ops import metrics
from bench import jpeg_in_process


def test_decoder_entries_read_kind_launches_and_flags() -> None:
    entries = jpeg_in_process.decoder_entries("tv2=torchvision:2,direct4=direct:4:pre:high")
    assert entries == {
        "tv2": {"nvjpeg": "torchvision", "launches": 2, "preallocate": None, "priority": "normal"},
        "direct4": {"nvjpeg": "direct", "launches": 4, "preallocate": (500, 375), "priority": "high"},
    }


@pytest.mark.parametrize("entry", ["x=pillow:2", "x=direct:2:fast"])
def test_an_unknown_kind_or_flag_is_refused_saying_what_is_known(entry: str) -> None:
    with pytest.raises(SystemExit, match="torchvision or direct, flags pre and high"):
        jpeg_in_process.decoder_entries(entry)


class Decoder:
    """The GPU decoder's stand-in: a photo's pixels into the caller's row at once, as a future; each call a batch of
    one, counted as the decoder counts its batches."""

    nvjpeg = "stand-in"
    launches = 1

    def __init__(self) -> None:
        self.batches_launched = self.images_launched = 0

    def decode(self, data: bytearray, spec: Any, out: np.ndarray) -> asyncio.Future[np.ndarray]:
        self.batches_launched += 1
        self.images_launched += 1
        out[:] = 7
        future = asyncio.get_running_loop().create_future()
        future.set_result(out)
        return future


class Batcher:
    """The batcher's stand-in: a batch of 8 rows, 2 ms on the device, observed as the batcher observes its batches,
    as soon as 8 are waiting; fewer go 50 ms after the first of them, as the batcher's delay sends a partial batch
    (only once the clients stop here: they keep 8 waiting until then)."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[np.ndarray]] = []

    async def submit(self, pixels: np.ndarray) -> np.ndarray:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append(future)
        if len(self.waiting) == 8:
            self._launch(self.waiting)
        elif len(self.waiting) == 1:
            loop.call_later(0.05, self._launch, self.waiting)
        return await future

    def _launch(self, batch: list[asyncio.Future[np.ndarray]]) -> None:
        if batch is not self.waiting or not batch:  # launched already, full
            return
        metrics.BATCH_ROWS.labels(model="in-process-test").observe(len(batch))
        metrics.BATCH_COMPUTE.labels(model="in-process-test", bucket="8").observe(0.002)
        for waiting in batch:
            waiting.set_result(np.zeros((1, 10), np.float32))
        self.waiting = []


def test_a_point_counts_the_measured_window_and_reads_the_batcher_s_histograms_over_it_alone() -> None:
    metrics.BATCH_ROWS.labels(model="in-process-test").observe(100)  # before the point: not its batches
    decoder, spec = Decoder(), types.SimpleNamespace(input_shape=(3, 4, 4))
    figures = asyncio.run(
        jpeg_in_process.point(Batcher(), decoder, spec, [bytearray(b"photo")], clients=16, seconds=0.3)
    )
    assert figures["clients"] == 16 and 0 < figures["images_per_s"] < decoder.images_launched / 0.3
    server = figures["server"]
    assert server["batch_rows"]["mean"] == 8.0 and server["batch_compute_ms"]["mean"] == 2.0
    # The decoder's batches in the window (one photo each here); no GPU decoder's histograms moved.
    assert figures["decoder"] == {"kind": "stand-in", "launches": 1, "photos_a_batch": 1.0}
    assert all(server.get(key, {"count": 0})["count"] == 0 for key in ("jpeg_wait_ms", "jpeg_batch_ms"))


def test_a_profiled_point_records_each_sampler_s_exit_and_keeps_its_output(tmp_path: Any) -> None:
    true = shutil.which("true")
    assert true is not None
    spy = functools.partial(jpeg_in_process.start_py_spy, true, tmp_path, "profile-x", 0.3)
    spec = types.SimpleNamespace(input_shape=(3, 4, 4))
    figures = asyncio.run(jpeg_in_process.point(Batcher(), Decoder(), spec, [bytearray(b"photo")], 8, 0.3, spy))
    assert figures["py_spy"] == {"threads": 0, "gil": 0}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["profile-x-gil.log", "profile-x-threads.log"]
