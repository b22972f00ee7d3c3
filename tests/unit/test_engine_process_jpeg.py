"""JPEG uploads decoded where the GPU is: a worker's request goes to the engine process with its JPEGs
still encoded (an UPLOADS frame, several requests' together), is decoded there and inferred, and its
scores come back as any request's: one trip. The real link and the real host code over a real Unix
socket; the engine process's service is a stand-in whose "GPU decoder" is Pillow (no GPU here),
refusing what a test tells it to, as nvJPEG refuses an image, and whose batcher answers each row's
pixel sum, so that a score says which pixels were inferred."""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from app.batching.queue import enqueue
from app.codecs.bodies import decode_image
from app.codecs.uploads import upload_images
from app.engine_process.client import EngineLink, EngineUploads, RemoteBatcher, RemoteJpegDecoder
from app.errors import GpuDecodeError, InputError, NotReadyError, ServiceError
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
    """The engine process's decoder: Pillow's pixels, GpuDecodeError for the images it is told to refuse
    (as nvJPEG refuses what its header did not show), counted."""

    def __init__(self, *, writes_out: bool = True, refuses: tuple[bytes, ...] = ()) -> None:
        self.decoded = 0
        self.writes_out = writes_out  # False: a decoder that answers with an array of its own
        self.refuses = refuses

    async def decode(self, data: bytes | memoryview, spec: ModelSpec, out: np.ndarray | None = None) -> np.ndarray:
        if bytes(data) in self.refuses:
            raise GpuDecodeError("refused")
        self.decoded += 1
        pixels = decode_image(bytes(data), max_pixels=MAX_PIXELS, spec=spec)
        if out is None or not self.writes_out:
            return pixels
        np.copyto(out, pixels)  # as the GPU decoder: into the caller's row
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


class PixelSums:
    """The engine process's batcher: each row's score is the sum of its pixels, answered at once; the
    rows of every enqueue are kept, to tell frames apart."""

    def __init__(self) -> None:
        self.enqueued: list[int] = []  # rows an enqueue
        self.retired = False  # its version retired: the served model's ready_batcher refuses

    def ready(self) -> PixelSums:
        if self.retired:
            raise NotReadyError("this version was unloaded")
        return self

    def admit(self, deadline: float) -> None:
        pass

    def enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        self.enqueued.append(len(images))
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        future.set_result(images.reshape(len(images), -1).sum(axis=1, dtype=np.float32)[:, None])  # (k, 1)
        return future


def pixel_sums(uploads: list[bytes]) -> np.ndarray:
    """What PixelSums answers for these JPEGs decoded by Pillow: (k, 1)."""
    pixels = np.concatenate([decode_image(data, max_pixels=MAX_PIXELS, spec=SPEC) for data in uploads])
    return pixels.reshape(len(uploads), -1).sum(axis=1, dtype=np.float32)[:, None]


@asynccontextmanager
async def engine_process(tmp_path: Path, decoder: Any, *, frames_in_flight: int = 16,
                         batchers: dict[str, PixelSums] | None = None
                         ) -> AsyncIterator[tuple[EngineLink, PixelSums]]:  # fmt: skip
    """The host serving SPEC's versions (by default its own), each answered by its PixelSums, and a worker's
    link to it; the link and the first version's batcher."""
    batchers = batchers or {SPEC.version: PixelSums()}
    versions = {}
    for version, batcher in batchers.items():
        served = stand_in(SPEC)
        served.ready_batcher = batcher.ready
        versions[version] = served
    socket_path = str(tmp_path / "engine.sock")
    async with serving_host(socket_path, {SPEC.name: versions}, repository=tmp_path, jpeg_decoder=decoder):
        (tmp_path / "segments").mkdir()
        link = EngineLink(socket_path, str(tmp_path / "segments"), on_dead=lambda why: None,
                          upload_frames_in_flight=frames_in_flight)  # fmt: skip
        await link.connect(timeout_s=5)
        try:
            yield link, next(iter(batchers.values()))
        finally:
            await link.close()


async def infer(link: EngineLink, uploads: list[bytes]) -> np.ndarray:
    """A request's JPEGs as a route takes them (upload_images, then the data plane's enqueue): (k, 1) sums."""
    images = await upload_images(uploads, max_pixels=MAX_PIXELS, spec=SPEC, gpu=RemoteJpegDecoder(link))
    return await enqueue(link_queue(link), images, math.inf)


async def in_flight(link: EngineLink, uploads: list[bytes]) -> asyncio.Future[np.ndarray]:
    """A request sent, its frame written: the answer's future."""
    answer = asyncio.ensure_future(infer(link, uploads))
    for _ in range(1000):  # its task's step, then the outbox's flush: a few turns of the loop
        if link._jpegs.pending:
            return answer
        await asyncio.sleep(0)
    raise AssertionError("the request was not sent")


def link_queue(link: EngineLink) -> RemoteBatcher:
    return RemoteBatcher(link, link.table[SPEC.name][SPEC.version])


def test_uploads_go_undecoded_and_are_inferred_on_the_pixels_pillow_gives(tmp_path: Path) -> None:
    decoder = PillowAsGpu()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as (link, _):
            assert link.decodes_jpeg
            uploads = [jpeg(seed) for seed in range(5)]
            images = await upload_images(uploads[:1], max_pixels=MAX_PIXELS, spec=SPEC, gpu=RemoteJpegDecoder(link))
            assert isinstance(images, EngineUploads) and len(images) == 1  # not decoded in the worker
            got = await asyncio.gather(*(infer(link, [data]) for data in uploads))
            for data, scores in zip(uploads, got, strict=True):
                np.testing.assert_array_equal(scores, pixel_sums([data]))
            assert decoder.decoded == 5
            made = len(link.pool.segments)
            await asyncio.gather(*(infer(link, [data]) for data in uploads))  # the same again
            assert len(link.pool.segments) == made  # given back and reused: no new segment for the second five

    asyncio.run(scenario())


def test_uploads_waiting_together_go_in_one_frame_and_one_enqueue_each_answered_its_own_rows(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu(), frames_in_flight=1) as (link, batcher):
            requests = [[jpeg(1)], [jpeg(2), jpeg(3), jpeg(4)], [jpeg(5)]]  # the second: a v2 BYTES input of 3
            first = await in_flight(link, [jpeg(0)])  # the one frame in flight: the rest wait for it
            got = await asyncio.gather(*(infer(link, uploads) for uploads in requests))
            await first
            assert batcher.enqueued == [1, 5]  # the waiting three requests' five images: one frame, one enqueue
            for uploads, scores in zip(requests, got, strict=True):
                np.testing.assert_array_equal(scores, pixel_sums(uploads))

    asyncio.run(scenario())


def refusals_in_one_frame(tmp_path: Path, requests: list[list[bytes]], refused: tuple[bytes, ...]
                          ) -> tuple[list[np.ndarray], float, list[int], int]:  # fmt: skip
    """`requests` sent together, in one UPLOADS frame (a first request holds the link's one frame in flight
    meanwhile), to a decoder refusing `refused`: their scores, the images decoded here by Pillow, the
    batcher's enqueues after the first request's, and the images the "GPU" decoded."""
    decoder = PillowAsGpu(refuses=refused)

    async def scenario() -> tuple[list[np.ndarray], float, list[int], int]:
        async with engine_process(tmp_path, decoder, frames_in_flight=1) as (link, batcher):
            fallbacks = metrics_value("cpu_fallback")
            first = await in_flight(link, [jpeg(0)])
            got = await asyncio.gather(*(infer(link, uploads) for uploads in requests))
            await first
            return got, metrics_value("cpu_fallback") - fallbacks, batcher.enqueued[1:], decoder.decoded - 1

    got, here, enqueued, on_gpu = asyncio.run(scenario())
    for uploads, scores in zip(requests, got, strict=True):
        np.testing.assert_array_equal(scores, pixel_sums(uploads))
    return got, here, enqueued, on_gpu


def test_an_image_the_gpu_refuses_sends_only_its_own_request_to_the_worker_s_pillow(tmp_path: Path) -> None:
    refused = jpeg(9)
    requests = [[jpeg(1)], [refused], [jpeg(2), jpeg(3)]]  # one frame: its other requests stay on the GPU
    _, here, enqueued, on_gpu = refusals_in_one_frame(tmp_path, requests, (refused,))
    assert here == 1 and on_gpu == 3  # the refused image alone by Pillow here
    assert enqueued == [3, 1]  # the three decoded rows, then the refused one sent again as pixels


def test_a_request_with_one_refused_image_among_several_is_decoded_here_whole(tmp_path: Path) -> None:
    refused = jpeg(9)
    requests = [[jpeg(1)], [jpeg(5), refused]]  # a v2 BYTES input of two, one of them refused
    _, here, enqueued, on_gpu = refusals_in_one_frame(tmp_path, requests, (refused,))
    assert here == 2 and on_gpu == 2  # both of its images by Pillow (jpeg(5)'s decoded row goes unused)
    assert enqueued == [2, 2]


def test_a_frame_whose_images_are_all_refused_is_handed_back_whole(tmp_path: Path) -> None:
    refused = (jpeg(8), jpeg(9))
    requests = [[refused[0]], [refused[1]]]
    _, here, enqueued, on_gpu = refusals_in_one_frame(tmp_path, requests, refused)
    assert here == 2 and on_gpu == 0 and sum(enqueued) == 2  # nothing inferred there; both sent as pixels


def metrics_value(decoder: str) -> float:
    from app.ops import metrics

    return metrics.IMAGE_DECODES.labels(decoder=decoder)._value.get()


def test_a_bad_upload_is_the_same_clear_error_through_the_engine_process(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu()) as (link, _):
            truncated = jpeg(2)[:200]  # no end-of-image marker: decoded here by Pillow, which refuses it
            with pytest.raises(InputError):
                await infer(link, [truncated])

    asyncio.run(scenario())


def test_a_decoder_that_answers_with_its_own_array_is_still_inferred_on_its_pixels(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu(writes_out=False)) as (link, _):
            uploads = [jpeg(7), jpeg(8)]
            np.testing.assert_array_equal(await infer(link, uploads), pixel_sums(uploads))

    asyncio.run(scenario())


def test_a_decoder_that_answers_futures_is_answered_from_their_callbacks(tmp_path: Path) -> None:
    # The GPU decoder's decode is a future: the host enqueues from the last one's callback, no task.
    decoder = HeldFutures()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as (link, _):
            uploads = [jpeg(seed) for seed in range(3)]
            answers = asyncio.gather(*(infer(link, [data]) for data in uploads))
            while len(decoder.held) < 3:
                await decoder.arrived.wait()
                decoder.arrived.clear()
            assert decoder.finish() == 3
            for data, scores in zip(uploads, await answers, strict=True):
                np.testing.assert_array_equal(scores, pixel_sums([data]))

    asyncio.run(scenario())


def test_a_worker_gone_mid_decode_has_its_decode_cancelled(tmp_path: Path) -> None:
    decoder = HeldFutures()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as (link, batcher):
            pending = asyncio.ensure_future(infer(link, [jpeg(3)]))
            await decoder.arrived.wait()
            ((_, _, _, future),) = decoder.held
            await link.close()  # the worker goes while its upload is being decoded
            for _ in range(100):
                if future.done():
                    break
                await asyncio.sleep(0.01)
            assert future.cancelled()  # so the decoder skips it, and nothing is enqueued for nobody
            assert decoder.finish() == 0 and batcher.enqueued == []
            pending.cancel()

    asyncio.run(scenario())


def test_a_version_retired_while_its_uploads_decode_answers_them_503_not_a_hang(tmp_path: Path) -> None:
    # Retiring stops the version's batcher once nothing is queued, and decoding rows are not queued yet: the
    # host asks for the batcher again once they are decoded, as an INFER frame asks on arrival.
    decoder = HeldFutures()

    async def scenario() -> None:
        async with engine_process(tmp_path, decoder) as (link, batcher):
            pending = asyncio.ensure_future(infer(link, [jpeg(5)]))
            await decoder.arrived.wait()
            batcher.retired = True  # as Service.retire does meanwhile: ready_batcher refuses
            assert decoder.finish() == 1
            with pytest.raises(ServiceError) as caught:
                await asyncio.wait_for(pending, timeout=5)
            assert caught.value.status == 503

    asyncio.run(scenario())


def test_uploads_go_to_the_version_their_queue_admitted_them_on(tmp_path: Path) -> None:
    # Two versions served at once (a reload's old and new): the frame names the admitting queue's version.
    batchers = {"1": PixelSums(), "2": PixelSums()}

    async def scenario() -> None:
        async with engine_process(tmp_path, PillowAsGpu(), batchers=batchers) as (link, _):
            for version in ("1", "2", "1"):
                queue = RemoteBatcher(link, link.table[SPEC.name][version])
                images = await upload_images([jpeg(6)], max_pixels=MAX_PIXELS, spec=SPEC, gpu=RemoteJpegDecoder(link))
                np.testing.assert_array_equal(await enqueue(queue, images, math.inf), pixel_sums([jpeg(6)]))

    asyncio.run(scenario())
    assert batchers["1"].enqueued == [1, 1] and batchers["2"].enqueued == [1]


def test_a_decoder_answering_pixels_of_another_shape_is_a_clear_500_not_a_wait(tmp_path: Path) -> None:
    class WrongShape(HeldFutures):
        def decode(self, data: memoryview, spec: ModelSpec, out: np.ndarray | None = None) -> asyncio.Future[Any]:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.set_result(np.zeros((1, 3, 5, 5), np.uint8))  # not the model's (1, 1, 28, 28)
            return future

    async def scenario() -> None:
        async with engine_process(tmp_path, WrongShape()) as (link, _):
            with pytest.raises(ServiceError) as caught:
                await asyncio.wait_for(infer(link, [jpeg(4)]), timeout=5)
            assert caught.value.status == 500

    asyncio.run(scenario())


def test_without_a_gpu_decoder_the_workers_are_told_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path, None) as (link, _):
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

    def start_jpeg_decoder(
        setting: str, device: str, *, max_batch: int, launches: int, nvjpeg: str, priority: str, preallocate: str
    ) -> PillowAsGpu:
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
    assert isinstance(first, PillowAsGpu) and started[0] == ("gpu", "cuda:1", 48, 0)  # 0: the decoder's count
    assert isinstance(second, RemoteJpegDecoder) and len(started) == 2  # its start failed: the engine process's
    assert isinstance(third, RemoteJpegDecoder) and len(started) == 2
