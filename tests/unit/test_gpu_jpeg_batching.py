"""app/codecs/gpu_jpeg.py's batching and refusals, on the CPU: nvJPEG and CUDA's streams and events stood in for.

What is tested is the decoder's own logic — who waits, what is launched together, what one bad
upload costs, what a cancelled upload costs — not nvJPEG: its `decode_jpeg(list, ...)` is
played by Pillow (full-size decode, as nvJPEG's), the stream and device contexts do nothing and
events are complete when recorded (as they are on the CPU, where everything is synchronous).
tests/gpu/test_gpu_jpeg.py runs the same decoder on the device.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import sys
import threading
import time
import types
from collections.abc import Iterator
from enum import Enum
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from app.codecs.bodies import decode_image
from app.errors import GpuDecodeError
from loadtest.photos import encode, synthetic_photo
from tests.unit.test_image_upload import RESNET50
from tests.unit.test_loop_lag import _count, _sum

JPEGS = [encode(synthetic_photo(320, 240, seed=i), quality=90) for i in range(12)]
BAD = JPEGS[0][:600] + b"\xff\xd0\xff\xc4" + bytes(len(JPEGS[0]) - 606) + JPEGS[0][-2:]  # Pillow refuses it


class ReadMode(Enum):
    RGB = "RGB"
    GRAY = "L"


class NoEvent:
    def __init__(self, blocking: bool = False) -> None:
        pass

    def record(self, stream: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Images per decode_jpeg call, as app.codecs.gpu_jpeg (imported afresh against the stand-ins) makes them."""
    made: list[int] = []

    def decode_jpeg(encoded: list[torch.Tensor], *, mode: ReadMode, device: Any) -> list[torch.Tensor]:
        made.append(len(encoded))
        images = []
        for tensor in encoded:
            try:
                pixels = np.array(Image.open(io.BytesIO(tensor.numpy().tobytes())).convert(mode.value))
            except OSError as error:  # torchvision wraps nvJPEG's status in a RuntimeError, one for the call
                raise RuntimeError(f"Error while decoding JPEG images: {error}") from None
            images.append(torch.from_numpy(pixels).permute(2, 0, 1).contiguous())  # (3, H, W)
        return images

    torchvision = types.ModuleType("torchvision")
    torchvision.io = types.SimpleNamespace(decode_jpeg=decode_jpeg, ImageReadMode=ReadMode)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", torchvision)
    monkeypatch.setitem(sys.modules, "torchvision.io", torchvision.io)
    monkeypatch.setattr(
        torch.cuda,
        "Stream",
        lambda device, priority=0: types.SimpleNamespace(wait_stream=lambda other: None, wait_event=lambda event: None),
    )
    monkeypatch.setattr(torch.cuda, "Event", NoEvent)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *shape, pin_memory=False, **options: empty(*shape, **options))
    real = sys.modules.pop("app.codecs.gpu_jpeg", None)
    try:
        yield made
    finally:
        sys.modules.pop("app.codecs.gpu_jpeg", None)
        if real is not None:
            sys.modules["app.codecs.gpu_jpeg"] = real


def decode_together(
    uploads: list[bytes], *, max_batch: int = 32, launches: int = 2, cancel: int | None = None
) -> tuple[list[Any], Any]:
    from app.codecs.gpu_jpeg import GpuJpegDecoder

    async def run() -> tuple[list[Any], Any]:
        decoder = GpuJpegDecoder("cpu", max_batch=max_batch, launches=launches)
        try:
            tasks = [asyncio.ensure_future(decoder.decode(data, RESNET50)) for data in uploads]
            if cancel is not None:
                tasks[cancel].cancel()  # before the collector runs: its deadline passed while queued
            return list(await asyncio.gather(*tasks, return_exceptions=True)), decoder
        finally:
            decoder.close()

    return asyncio.run(run())


def test_concurrent_uploads_share_one_decode_call_up_to_max_batch(calls: list[int]) -> None:
    results, decoder = decode_together(JPEGS)
    assert list(decoder.batch_sizes) == [12] and calls == [12]
    results_split, decoder = decode_together(JPEGS, max_batch=5)
    assert sorted(decoder.batch_sizes) == [2, 5, 5]  # two launches at once: either may be back first
    assert (decoder.batches_launched, decoder.images_launched) == (3, 12)  # the benchmark's mean batch
    for got, split, data in zip(results, results_split, JPEGS, strict=True):
        assert got.shape == (1, 3, 224, 224) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, split)
        # Within a level of Pillow's own path (a small JPEG: no reduced-scale decode to differ by).
        assert np.abs(got.astype(np.int16) - decode_image(data, max_pixels=2**24, spec=RESNET50)).max() <= 1


def test_a_batch_of_mixed_sizes_and_models_answers_each_upload_as_if_alone(calls: list[int]) -> None:
    # Same-size images of one model are resized together: no upload may get another's size or crop.
    from app.codecs.gpu_jpeg import GpuJpegDecoder

    small = dataclasses.replace(RESNET50, config=RESNET50.config.model_copy(update={"input_shape": (3, 96, 96)}))
    sizes = [(320, 240), (500, 375), (320, 240), (240, 320), (500, 375)]
    uploads = [(encode(synthetic_photo(*size, seed=i), quality=90), RESNET50 if i % 2 else small)
               for i, size in enumerate(sizes)]  # fmt: skip

    async def run(max_batch: int) -> list[np.ndarray]:
        decoder = GpuJpegDecoder("cpu", max_batch=max_batch)
        try:
            return list(await asyncio.gather(*(decoder.decode(data, spec) for data, spec in uploads)))
        finally:
            decoder.close()

    together, alone = asyncio.run(run(32)), asyncio.run(run(1))
    assert calls == [5, 1, 1, 1, 1, 1]
    for got, single, (_, spec) in zip(together, alone, uploads, strict=True):
        assert got.shape == (1, *spec.input_shape)
        np.testing.assert_array_equal(got, single)


def test_an_upload_s_wait_for_its_launch_and_each_batch_s_time_are_observed(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where an upload's time goes (issue 26). A clock that nvJPEG's stand-in moves on by 1 s a call:
    # twelve uploads arrive at 0, batches of five launch one after the other (one launch at a time) at
    # 0, 1 and 2 → waits 5 × 0 + 5 × 1 + 2 × 2.
    from app.ops import metrics

    clock = [0.0]
    decode_jpeg = sys.modules["torchvision"].io.decode_jpeg

    def slow_decode_jpeg(encoded: list[torch.Tensor], **options: Any) -> list[torch.Tensor]:
        clock[0] += 1.0
        return decode_jpeg(encoded, **options)

    monkeypatch.setattr(sys.modules["torchvision"].io, "decode_jpeg", slow_decode_jpeg)
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])  # before gpu_jpeg is imported: _Job reads it
    waits, batches = metrics.GPU_JPEG_WAIT, metrics.GPU_JPEG_BATCH_SECONDS
    before = (_count(waits), _sum(waits), _count(batches), _sum(batches))
    _, decoder = decode_together(JPEGS, max_batch=5, launches=1)
    assert list(decoder.batch_sizes) == [5, 5, 2]
    assert (_count(waits) - before[0], _sum(waits) - before[1]) == (12, 9.0)
    assert _count(batches) - before[2] == 3 and _sum(batches) - before[3] >= 3.0  # each took its 1 s at least


def test_a_second_batch_is_launched_while_the_first_is_still_in_nvjpeg(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two launches at once (the default): the first batch's decode returns only once the second's has
    # begun. One launch at a time, the first would wait its 5 s out alone.
    decode_jpeg = sys.modules["torchvision"].io.decode_jpeg
    second_began, first_saw_it, order = threading.Event(), [], itertools.count()

    def decode_awaiting_the_next(encoded: list[torch.Tensor], **options: Any) -> list[torch.Tensor]:
        if next(order) == 0:  # the first call (next() is atomic under the GIL)
            first_saw_it.append(second_began.wait(timeout=5))
        else:
            second_began.set()
        return decode_jpeg(encoded, **options)

    monkeypatch.setattr(sys.modules["torchvision"].io, "decode_jpeg", decode_awaiting_the_next)
    results, _ = decode_together(JPEGS, max_batch=6)
    assert first_saw_it == [True] and sorted(calls) == [6, 6]
    assert all(isinstance(r, np.ndarray) and r.shape == (1, 3, 224, 224) for r in results)


def test_a_size_s_images_are_resized_in_groups_of_at_most_the_budget(calls: list[int]) -> None:
    from app.codecs.gpu_jpeg import _by_model_and_size, _Job

    jobs = [_Job(b"", RESNET50, None, None) for _ in range(6)]  # type: ignore[arg-type]
    small, large = torch.zeros(3, 4, 4, dtype=torch.uint8), torch.zeros(3, 8, 8, dtype=torch.uint8)
    decoded = [(0, small), (1, large), (2, small), (3, small), (4, small), (5, small)]
    groups = _by_model_and_size(jobs, decoded, max_values=2 * small.numel())
    assert [[i for i, _ in group] for _, group in groups] == [[0, 2], [1], [3, 4], [5]]
    # An image over the budget on its own is still one group of one.
    assert [len(g) for _, g in _by_model_and_size(jobs, decoded[:2], max_values=1)] == [1, 1]


def test_pixels_go_into_the_caller_s_buffer_from_bytes_read_in_place(calls: list[int]) -> None:
    # The engine process hands the worker's segment: the upload's bytes are read from it and its
    # pixels written back over them, (1, C, h, w) at its start.
    from app.codecs.gpu_jpeg import GpuJpegDecoder

    segment = bytearray(max(len(JPEGS[0]), 3 * 224 * 224))
    segment[: len(JPEGS[0])] = JPEGS[0]
    out = np.ndarray((1, 3, 224, 224), np.uint8, buffer=segment)

    async def run() -> tuple[np.ndarray, np.ndarray]:
        decoder = GpuJpegDecoder("cpu")
        try:
            return await decoder.decode(memoryview(segment)[: len(JPEGS[0])], RESNET50, out=out), await decoder.decode(
                JPEGS[0], RESNET50
            )
        finally:
            decoder.close()

    written, alone = asyncio.run(run())
    assert written is out
    np.testing.assert_array_equal(np.frombuffer(segment, np.uint8, out.size).reshape(out.shape), alone)


def test_a_writable_view_is_read_in_place_and_anything_else_copied_once(calls: list[int]) -> None:
    from app.codecs.gpu_jpeg import _writable

    segment = bytearray(JPEGS[0])
    view = memoryview(segment)
    assert _writable(view) is view  # the engine process's segment: no copy
    assert isinstance(_writable(JPEGS[0]), bytearray)  # bytes: one copy, writable
    assert isinstance(_writable(memoryview(JPEGS[0])), bytearray)  # a read-only view: one copy


def test_an_upload_cancelled_after_its_launch_leaves_its_buffer_unwritten(calls: list[int]) -> None:
    # The worker gave up (disconnected) while its batch ran: its segment may be reused, not written.
    from app.codecs.gpu_jpeg import GpuJpegDecoder

    decode_jpeg = sys.modules["torchvision"].io.decode_jpeg
    out = np.zeros((1, 3, 224, 224), np.uint8)

    async def run() -> Any:
        loop = asyncio.get_running_loop()
        decoder = GpuJpegDecoder("cpu")
        task: asyncio.Task[np.ndarray] | None = None

        def cancel_while_decoding(encoded: list[torch.Tensor], **options: Any) -> list[torch.Tensor]:
            assert task is not None
            loop.call_soon_threadsafe(task.cancel)  # before the hand-back, which runs on the loop after
            return decode_jpeg(encoded, **options)

        sys.modules["torchvision"].io.decode_jpeg = cancel_while_decoding
        try:
            task = asyncio.ensure_future(decoder.decode(JPEGS[0], RESNET50, out=out))
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for _ in range(200):  # its launch returns on the collector, then its hand-back runs
                if decoder.batches_launched and not decoder._batches:
                    break
                await asyncio.sleep(0.01)
            return decoder
        finally:
            sys.modules["torchvision"].io.decode_jpeg = decode_jpeg
            decoder.close()

    decoder = asyncio.run(run())
    assert list(decoder.batch_sizes) == [1]  # it was launched
    assert not out.any()


def test_one_refused_upload_is_retried_alone_and_only_it_falls_back(calls: list[int]) -> None:
    results, decoder = decode_together([JPEGS[1], BAD, JPEGS[2]])
    assert list(decoder.batch_sizes) == [3] and calls == [3, 1, 1, 1]  # the batch, then one image at a time
    assert isinstance(results[1], GpuDecodeError) and "Error while decoding JPEG images" in str(results[1])
    assert isinstance(results[0], np.ndarray) and isinstance(results[2], np.ndarray)


def test_a_cancelled_upload_is_not_decoded(calls: list[int]) -> None:
    results, decoder = decode_together(JPEGS[:4], cancel=1)
    assert isinstance(results[1], asyncio.CancelledError)
    assert list(decoder.batch_sizes) == [3] and calls == [3]


def test_a_fault_outside_nvjpeg_fails_its_batch_and_later_uploads_still_decode(calls: list[int]) -> None:
    from app.codecs.gpu_jpeg import GpuJpegDecoder

    async def run() -> tuple[list[Any], Any]:
        decoder = GpuJpegDecoder("cpu")
        # A spec whose input has 1 channel but whose colour is RGB: preprocess_batch refuses the image.
        broken = dataclasses.replace(RESNET50, config=RESNET50.config.model_copy(update={"input_shape": (1, 224, 224)}))
        try:
            first = await asyncio.gather(decoder.decode(JPEGS[0], broken), return_exceptions=True)
            return [*first, await decoder.decode(JPEGS[1], RESNET50)], decoder
        finally:
            decoder.close()

    (fault, later), _ = asyncio.run(run())
    assert isinstance(fault, ValueError) and "expected (k, 1, H, W) uint8 images" in str(fault)  # a 500, logged
    assert later.shape == (1, 3, 224, 224)


def test_closing_answers_every_upload_still_queued_or_in_a_batch(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() (the server stopping) while a batch is in nvJPEG and more uploads queue: every caller
    gets 503, none waits for ever (before, the batch's hand-back waited on a closed event waiter)."""
    from app.codecs.gpu_jpeg import GpuJpegDecoder
    from app.errors import NotReadyError

    decode_jpeg = sys.modules["torchvision"].io.decode_jpeg
    in_nvjpeg, release = threading.Event(), threading.Event()

    def slow(encoded: list[torch.Tensor], **options: Any) -> list[torch.Tensor]:
        in_nvjpeg.set()
        release.wait(timeout=5)
        return decode_jpeg(encoded, **options)

    monkeypatch.setattr(sys.modules["torchvision"].io, "decode_jpeg", slow)

    async def run() -> list[Any]:
        decoder = GpuJpegDecoder("cpu", max_batch=4, launches=1)
        tasks = [asyncio.ensure_future(decoder.decode(data, RESNET50)) for data in JPEGS]
        assert await asyncio.to_thread(in_nvjpeg.wait, 5)
        threading.Timer(0.2, release.set).start()  # the launch on its thread ends; close() waits for it
        decoder.close()
        return list(await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5))

    results = asyncio.run(run())
    assert len(results) == len(JPEGS) and all(isinstance(r, NotReadyError) for r in results), results


class StandInBatchDecoder:
    """app/codecs/nvjpeg.py's BatchDecoder: Pillow's (C, H, W) pixels, UNSUPPORTED for progressive JPEGs
    (as the hardware says of them), a header's fault for what Pillow cannot open, NvJpegError for a whole
    batch holding `fails_batch`; counts its batches."""

    def __init__(self, fails_batch: bytes | None = None, waited_s: float = 0.0) -> None:
        self.batches: list[int] = []
        self.fails_batch = fails_batch
        self.closed = False
        self.wait_s = waited_s  # slept at each decode, as BatchDecoder waits for its state's previous batch
        self.waited_s = 0.0  # the last decode's, as BatchDecoder says it

    def close(self) -> None:
        self.closed = True

    def decode(self, images: list[Any], gray: bool) -> tuple[list[Any], NoEvent]:
        from app.codecs.nvjpeg import UNSUPPORTED, NvJpegError

        self.batches.append(len(images))
        time.sleep(self.wait_s)
        self.waited_s = self.wait_s
        if self.fails_batch is not None and any(bytes(image) == self.fails_batch for image in images):
            raise NvJpegError("nvJPEG batched decode failed: execution failed")
        results: list[Any] = []
        for image in images:
            try:
                opened = Image.open(io.BytesIO(bytes(image)))
            except OSError:
                results.append("nvJPEG could not read its header: bad JPEG")
                continue
            if opened.info.get("progressive"):
                results.append(UNSUPPORTED)
                continue
            pixels = np.array(opened.convert("L" if gray else "RGB"))
            results.append(torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1).contiguous())
        return results, NoEvent()


def decode_directly(uploads: list[bytes], stand_in: StandInBatchDecoder) -> list[Any]:
    """decode_together with CGSERVE_JPEG_NVJPEG=direct, its decoder state the stand-in."""
    import queue

    from app.codecs.gpu_jpeg import GpuJpegDecoder  # afresh, against the stand-ins (the fixture)

    async def run() -> list[Any]:
        decoder = GpuJpegDecoder("cpu", launches=1)
        decoder._direct = queue.SimpleQueue()
        decoder._direct.put(stand_in)  # type: ignore[arg-type]
        decoder._nvjpeg = stand_in  # type: ignore[assignment]  # its close stands for the handle's (states, then it)
        try:
            return list(await asyncio.gather(*(decoder.decode(d, RESNET50) for d in uploads), return_exceptions=True))
        finally:
            decoder.close()

    return asyncio.run(run())


PROGRESSIVE = encode(synthetic_photo(320, 240, seed=20), quality=90, progressive=True)
NOT_AN_IMAGE = b"\xff\xd8 not a JPEG after all"


def test_the_direct_decoder_s_pixels_are_torchvision_s_and_what_it_does_not_take_goes_there(
    calls: list[int],
) -> None:
    uploads = [JPEGS[3], PROGRESSIVE, JPEGS[4], NOT_AN_IMAGE]
    stand_in = StandInBatchDecoder()
    direct = decode_directly(uploads, stand_in)
    assert stand_in.batches == [4] and calls == [1]  # the progressive one alone through torchvision
    by_torchvision, _ = decode_together(uploads[:3])
    for got, want in zip(direct[:3], by_torchvision, strict=True):
        np.testing.assert_array_equal(got, want)
    assert isinstance(direct[3], GpuDecodeError) and "could not read its header" in str(direct[3])
    assert stand_in.closed  # the decoder's close destroys its states


def test_the_direct_decoders_wait_for_its_state_is_a_stage_of_its_own(calls: list[int]) -> None:
    """The decode stage held the wait for the state's previous batch on the device as well as nvJPEG's call (run 60
    could not tell them apart): that wait is observed as state_wait, and decode is the rest."""
    from prometheus_client import REGISTRY

    def stage(name: str, what: str) -> float:
        return REGISTRY.get_sample_value(f"cgserve_gpu_jpeg_stage_seconds_{what}", {"stage": name}) or 0.0

    before = {(name, what): stage(name, what) for name in ("state_wait", "decode") for what in ("sum", "count")}
    results = decode_directly([JPEGS[5], JPEGS[6]], StandInBatchDecoder(waited_s=0.2))
    assert all(isinstance(result, np.ndarray) for result in results)
    batches = stage("state_wait", "count") - before["state_wait", "count"]
    assert batches >= 1 and stage("decode", "count") - before["decode", "count"] == batches
    # and the wait for a free state from the pool, here a few microseconds
    assert stage("state_wait", "sum") - before["state_wait", "sum"] == pytest.approx(0.2 * batches, abs=0.01)
    assert stage("decode", "sum") - before["decode", "sum"] >= 0  # the rest of the call, the wait taken out


def test_a_batch_the_direct_decoder_refuses_whole_goes_through_torchvision(calls: list[int]) -> None:
    stand_in = StandInBatchDecoder(fails_batch=BAD)
    results = decode_directly([JPEGS[5], BAD, JPEGS[6]], stand_in)
    assert stand_in.batches == [3] and calls == [3, 1, 1, 1]  # torchvision's way: the batch, then one at a time
    assert isinstance(results[0], np.ndarray) and isinstance(results[2], np.ndarray)
    assert isinstance(results[1], GpuDecodeError)


class StandInHandle:
    """NvJpeg's stand-in for _direct_decoders: its decoders' preallocations, and whether it was closed."""

    def __init__(self, refuses: bool = False) -> None:
        self.sized: list[tuple[int, int, int, int]] = []  # (state, batch, width, height)
        self.refuses, self.closed = refuses, False
        self.made: list[int] = []  # the states made, numbered

    def decoder(self, device: Any, priority: int = 0) -> Any:
        from app.codecs.nvjpeg import NvJpegError

        state = len(self.made)
        self.made.append(state)

        def preallocate(batch: int, width: int, height: int) -> None:
            if self.refuses:
                raise NvJpegError(
                    f"nvJPEG preallocation for {batch} images of {width}x{height} failed: allocator failure"
                )
            self.sized.append((state, batch, width, height))

        return types.SimpleNamespace(preallocate=preallocate)

    def close(self) -> None:
        self.closed = True


def test_each_launch_s_state_is_sized_once_and_a_size_nvjpeg_refuses_stops_start_up_saying_so(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.codecs import gpu_jpeg  # afresh, against the stand-ins (the fixture)

    handle = StandInHandle()
    monkeypatch.setattr(gpu_jpeg, "NvJpeg", lambda: handle)
    nvjpeg, pool = gpu_jpeg._direct_decoders(torch.device("cpu"), 3, 0, (128, 500, 375))
    assert nvjpeg is handle and pool is not None and pool.qsize() == 3
    assert sorted(handle.sized) == [(state, 128, 500, 375) for state in range(3)] and not handle.closed  # each once

    refusing = StandInHandle(refuses=True)  # CGSERVE_JPEG_PREALLOCATE too large for the device: not a quiet fallback
    monkeypatch.setattr(gpu_jpeg, "NvJpeg", lambda: refusing)
    said = r"CGSERVE_JPEG_PREALLOCATE=9000x9000: nvJPEG could not size its 2 decoder states for 128 photos that large"
    with pytest.raises(ValueError, match=said + r" \(.*allocator failure\); set 0 to let them grow"):
        gpu_jpeg._direct_decoders(torch.device("cpu"), 2, 0, (128, 9000, 9000))
    assert refusing.closed  # its states and handle let go


def test_launches_0_is_the_count_of_the_decoder_started(calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """CGSERVE_JPEG_LAUNCHES=0: 4 for the direct decoder, over its 3 states; 2 for torchvision's, asked for or taken
    where the GPU has no JPEG engines (a review found the door's buffers counted for 3 there); a count set is kept."""
    from app.codecs import gpu_jpeg  # afresh, against the stand-ins (the fixture)
    from app.codecs.nvjpeg import NvJpegError

    handle = StandInHandle()
    monkeypatch.setattr(gpu_jpeg, "NvJpeg", lambda: handle)
    direct = gpu_jpeg.GpuJpegDecoder("cpu", nvjpeg="direct")
    assert (direct.nvjpeg, direct.launches, len(handle.made)) == ("direct", 4, gpu_jpeg.DIRECT_STATES)
    direct.close()

    def no_engines() -> None:
        raise NvJpegError("the hardware backend is not available on this GPU")

    monkeypatch.setattr(gpu_jpeg, "NvJpeg", no_engines)
    fallen_back = gpu_jpeg.GpuJpegDecoder("cpu", nvjpeg="direct")
    assert (fallen_back.nvjpeg, fallen_back.launches) == ("torchvision", 2)
    fallen_back.close()
    for nvjpeg, launches, want in (("torchvision", 0, 2), ("torchvision", 5, 5), ("direct", 1, 1)):
        decoder = gpu_jpeg.GpuJpegDecoder("cpu", nvjpeg=nvjpeg, launches=launches)
        assert decoder.launches == want, (nvjpeg, launches)
        decoder.close()
