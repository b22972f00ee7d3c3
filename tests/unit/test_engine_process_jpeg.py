"""JPEG uploads decoded where the GPU is: a worker's upload goes to the engine process's decoder
(a DECODE frame) and its pixels come back in the same segment. The real link and the real host
code over a real Unix socket; the engine process's service is a stand-in whose "GPU decoder" is
Pillow (no GPU here), refusing what a test tells it to, as nvJPEG refuses a CMYK JPEG."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from app.codecs.bodies import decode_image
from app.codecs.uploads import decode_upload
from app.engine_process.client import EngineLink, RemoteJpegDecoder
from app.errors import GpuDecodeError, InputError, ServiceError
from app.repository import read_repository
from app.repository.model_spec import ModelSpec
from tests.unit.stand_in_engine_host import serving_host, stand_in

MAX_PIXELS = 1 << 22
SPEC: ModelSpec = read_repository(Path(__file__).resolve().parents[2] / "models/repository")[0]  # the seed CNN


def jpeg(seed: int, mode: str = "RGB") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, format="JPEG")
    return buffer.getvalue()


class PillowAsGpu:
    """The engine process's decoder: Pillow's pixels, GpuDecodeError for CMYK (as nvJPEG), counted."""

    def __init__(self, *, writes_out: bool = True) -> None:
        self.decoded = 0
        self.writes_out = writes_out  # False: a decoder that answers with an array of its own

    async def decode(self, data: bytes | memoryview, spec: ModelSpec, out: np.ndarray | None = None) -> np.ndarray:
        if Image.open(io.BytesIO(data)).mode == "CMYK":
            raise GpuDecodeError("CMYK")
        self.decoded += 1
        pixels = decode_image(bytes(data), max_pixels=MAX_PIXELS, spec=spec)
        if out is None or not self.writes_out:
            return pixels
        np.copyto(out, pixels)  # as the GPU decoder: into the worker's segment, which `data` is part of
        return out

    def close(self) -> None:
        pass


class HeldFutures:
    """The engine process's decoder as the GPU's answers: a future an upload (no coroutine, so the host
    runs no task), held until `finish` fills each with Pillow's pixels as the GPU decoder does: into
    `out`, only where the future is not done (cancelled: the worker is gone, its segment with it)."""

    def __init__(self) -> None:
        self.held: list[tuple[bytes, ModelSpec, np.ndarray | None, asyncio.Future[np.ndarray]]] = []
        self.arrived = asyncio.Event()

    def decode(self, data: memoryview, spec: ModelSpec, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.held.append((bytes(data), spec, out, future))  # read at once, as a launch reads the segment
        self.arrived.set()
        return future

    def finish(self) -> int:
        """Answer everything held; how many were still wanted."""
        wanted = 0
        for data, spec, out, future in self.held:
            if future.done():
                continue
            wanted += 1
            pixels = decode_image(data, max_pixels=MAX_PIXELS, spec=spec)
            if out is not None:
                np.copyto(out, pixels)
            future.set_result(out if out is not None else pixels)
        self.held.clear()
        return wanted

    def close(self) -> None:
        pass


@asynccontextmanager
async def engine_process(tmp_path: Path, decoder: PillowAsGpu | None) -> AsyncIterator[EngineLink]:
    socket_path = str(tmp_path / "engine.sock")
    versions = {SPEC.name: {SPEC.version: stand_in(SPEC)}}
    async with serving_host(socket_path, versions, repository=tmp_path, jpeg_decoder=decoder):
        (tmp_path / "segments").mkdir()
        link = EngineLink(socket_path, str(tmp_path / "segments"), on_dead=lambda why: None)
        await link.connect(timeout_s=5)
        try:
            yield link
        finally:
            await link.close()


def test_uploads_are_decoded_by_the_engine_process_into_the_pixels_pillow_gives(tmp_path: Path) -> None:
    decoder = PillowAsGpu()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as link:
            assert link.decodes_jpeg
            remote = RemoteJpegDecoder(link)
            uploads = [jpeg(seed) for seed in range(5)]
            got = await asyncio.gather(*(remote.decode(data, SPEC) for data in uploads))
            for data, pixels in zip(uploads, got, strict=True):
                expected = decode_image(data, max_pixels=MAX_PIXELS, spec=SPEC)
                assert pixels.shape == expected.shape == (1, *SPEC.input_shape)
                np.testing.assert_array_equal(pixels, expected)
            assert decoder.decoded == 5
            made = len(link.pool.segments)
            await asyncio.gather(*(remote.decode(data, SPEC) for data in uploads))  # the same again
            assert len(link.pool.segments) == made  # given back and reused: no new segment for the second five

    asyncio.run(scenario())


def test_a_decoder_that_answers_with_its_own_array_still_fills_the_segment(tmp_path: Path) -> None:
    # The worker reads the pixels from its segment: whatever array the decoder returns, they go there.
    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu(writes_out=False)) as link:
            data = jpeg(7)
            pixels = await RemoteJpegDecoder(link).decode(data, SPEC)
            np.testing.assert_array_equal(pixels, decode_image(data, max_pixels=MAX_PIXELS, spec=SPEC))

    asyncio.run(scenario())


def test_an_image_the_gpu_refuses_is_decoded_by_the_workers_pillow(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu()) as link:
            remote = RemoteJpegDecoder(link)
            cmyk = jpeg(1, mode="CMYK")
            with pytest.raises(GpuDecodeError):
                await remote.decode(cmyk, SPEC)
            # What a route calls: the refusal goes to Pillow in the worker, the answer is Pillow's.
            pixels = await decode_upload(cmyk, max_pixels=MAX_PIXELS, spec=SPEC, gpu=remote)
            np.testing.assert_array_equal(pixels, decode_image(cmyk, max_pixels=MAX_PIXELS, spec=SPEC))

    asyncio.run(scenario())


def test_a_bad_upload_is_the_same_clear_error_through_the_engine_process(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu()) as link:
            truncated = jpeg(2)[:200]  # no end-of-image marker: decode_upload sends it to Pillow, which refuses it
            with pytest.raises(InputError):
                await decode_upload(truncated, max_pixels=MAX_PIXELS, spec=SPEC, gpu=RemoteJpegDecoder(link))

    asyncio.run(scenario())


def test_a_decoder_that_answers_futures_is_answered_from_their_callbacks(tmp_path: Path) -> None:
    # The GPU decoder's decode is a future: the host answers DECODED from its callback, each upload its own pixels.
    decoder = HeldFutures()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as link:  # type: ignore[arg-type]
            remote = RemoteJpegDecoder(link)
            uploads = [jpeg(seed) for seed in range(3)]
            answers = asyncio.gather(*(remote.decode(data, SPEC) for data in uploads))
            while len(decoder.held) < 3:
                await decoder.arrived.wait()
                decoder.arrived.clear()
            assert decoder.finish() == 3
            for data, pixels in zip(uploads, await answers, strict=True):
                np.testing.assert_array_equal(pixels, decode_image(data, max_pixels=MAX_PIXELS, spec=SPEC))

    asyncio.run(scenario())


def test_a_worker_gone_mid_decode_has_its_decode_cancelled_so_its_segment_is_not_written(tmp_path: Path) -> None:
    decoder = HeldFutures()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as link:  # type: ignore[arg-type]
            pending = asyncio.ensure_future(RemoteJpegDecoder(link).decode(jpeg(3), SPEC))
            await decoder.arrived.wait()
            ((_, _, _, future),) = decoder.held
            await link.close()  # the worker goes while its upload is being decoded
            for _ in range(100):
                if future.done():
                    break
                await asyncio.sleep(0.01)
            assert future.cancelled()  # so the decoder skips it: nothing writes into the gone worker's segment
            assert decoder.finish() == 0
            pending.cancel()

    asyncio.run(scenario())


def test_a_decoder_answering_pixels_of_another_shape_is_a_clear_500_not_a_wait(tmp_path: Path) -> None:
    class WrongShape(HeldFutures):
        def decode(self, data: memoryview, spec: ModelSpec, out: np.ndarray | None = None) -> asyncio.Future[Any]:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.set_result(np.zeros((1, 3, 5, 5), np.uint8))  # not the model's (1, 1, 28, 28)
            return future

    async def scenario() -> None:
        async with engine_process(tmp_path, WrongShape()) as link:  # type: ignore[arg-type]
            with pytest.raises(ServiceError) as caught:
                await asyncio.wait_for(RemoteJpegDecoder(link).decode(jpeg(4), SPEC), timeout=5)
            assert caught.value.status == 500

    asyncio.run(scenario())


def test_without_a_gpu_decoder_the_workers_are_told_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, None) as link:
            assert not link.decodes_jpeg

    asyncio.run(scenario())


def test_with_decode_in_workers_a_worker_decodes_on_the_engine_process_s_cuda_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CGSERVE_JPEG_DECODE_IN_WORKERS: real workers of a (stand-in) engine process whose model runs on
    cuda:1 start their own GPU decoder there, with the decoder's settings; a worker that cannot (its CUDA
    context refused) logs why and keeps the engine process's; so does one whose table has no CUDA model.
    (The decoder itself runs on the H200: tests/gpu/test_gpu_jpeg.py.)"""
    from types import SimpleNamespace

    from app import service as service_module
    from app.config import Settings
    from app.service import Service

    started: list[tuple[object, ...]] = []

    def start_jpeg_decoder(setting: str, device: str, *, max_batch: int, launches: int) -> PillowAsGpu:
        started.append((setting, device, max_batch, launches))
        if len(started) == 2:
            raise RuntimeError("CUDA error: out of memory")
        return PillowAsGpu()

    monkeypatch.setattr(service_module, "start_jpeg_decoder", start_jpeg_decoder)
    settings = Settings(model_repository=tmp_path, device="cpu", jpeg_decode_in_workers=True, jpeg_max_batch=48)
    socket_path = str(tmp_path / "engine.sock")
    on_gpu = stand_in(SPEC)
    on_gpu.options = SimpleNamespace(devices=("cpu", "cuda:1"))

    async def scenario() -> list[object]:
        decoders = []
        async with serving_host(socket_path, {SPEC.name: {SPEC.version: on_gpu}}, repository=tmp_path,
                                jpeg_decoder=PillowAsGpu()):  # fmt: skip
            for name in ("a", "b"):
                (tmp_path / f"segments-{name}").mkdir()
                worker = Service(settings, engine_process=(socket_path, str(tmp_path / f"segments-{name}")))
                worker.start()
                await worker.wait_started()
                decoders.append(worker.jpeg_decoder)
                await worker.stop()
        no_cuda = SimpleNamespace(table={"a": {"1": {"devices": ["cpu"]}}})
        decoders.append(await Service(settings)._own_jpeg_decoder(no_cuda))  # type: ignore[arg-type]
        return decoders

    first, second, third = asyncio.run(scenario())
    assert isinstance(first, PillowAsGpu) and started[0] == ("gpu", "cuda:1", 48, 2)
    assert isinstance(second, RemoteJpegDecoder) and len(started) == 2  # its start failed: the engine process's
    assert isinstance(third, RemoteJpegDecoder) and len(started) == 2
