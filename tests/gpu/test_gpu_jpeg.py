"""The batched GPU JPEG decoder (app/codecs/gpu_jpeg.py) on the device: its pixels against Pillow's, resnet50's
answers on them, its batching, bad uploads, and the HTTP path with CGSERVE_JPEG_DECODER=gpu.

How close is close enough: the resize and crop alone agree with Pillow within one level
(tests/unit/test_image_preprocess.py); Pillow decodes a large JPEG at reduced scale (0.4–0.6
levels on average at 1920×1080, measured there); nvJPEG's IDCT and chroma upsampling differ from
libjpeg-turbo's by about a level at colour edges. A mean of 3 levels leaves room for those and
still fails a crop off by 4 pixels (7 levels on these photos) or a channel swap (8–46).
"""

from __future__ import annotations

import asyncio
import base64
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("torchvision")  # the optional extra; without it the GPU decoder is never chosen

from app.codecs.bodies import decode_image
from app.codecs.gpu_jpeg import DIRECT_STATES, GpuJpegDecoder
from app.codecs.nvjpeg import BatchDecoder
from app.repository import load_model, read_repository
from app.repository.model_spec import ModelSpec
from loadtest.photos import encode, fashion_photo, synthetic_photo
from models.fashion_mnist import load_test_sample
from tests.integration.server_process import ROOT, free_port, running_server

EXAMPLES = ROOT / "models" / "examples" / "repository"
SPECS = {spec.name: spec for spec in read_repository(EXAMPLES)}
RESNET50, SEED_CNN = SPECS["resnet50"], SPECS["fashion-cnn"]
LIMIT = 16 * 2**20
MEAN_LEVELS = 3.0  # the module docstring says why
GARMENTS = load_test_sample()[0][:6]  # (6, 28, 28) uint8: real Fashion-MNIST test images


def grey_jpeg(garment: np.ndarray, quality: int = 90) -> bytes:
    """A (28, 28) garment upscaled to a 280×280 grey JPEG, for the seed CNN."""
    return encode(np.asarray(Image.fromarray(garment).resize((280, 280))), quality=quality)


def decode_all(
    items: list[tuple[bytes, ModelSpec]],
    *,
    max_batch: int = 32,
    launches: int = 2,
    nvjpeg: str = "torchvision",
    priority: str = "normal",
    preallocate: tuple[int, int] | None = None,
) -> tuple[list[object], list[int]]:
    """Decode concurrently on one decoder: each result (array or exception) and the batch sizes it launched."""

    async def run() -> tuple[list[object], list[int]]:
        decoder = GpuJpegDecoder(
            "cuda:0", max_batch=max_batch, launches=launches, nvjpeg=nvjpeg, priority=priority, preallocate=preallocate
        )
        assert decoder.nvjpeg == nvjpeg  # the H200 has JPEG engines: direct is not turned down there
        try:
            tasks = [decoder.decode(data, spec) for data, spec in items]
            return list(await asyncio.gather(*tasks, return_exceptions=True)), list(decoder.batch_sizes)
        finally:
            decoder.close()

    return asyncio.run(run())


def pillow(data: bytes, spec: ModelSpec) -> np.ndarray:
    return decode_image(data, max_pixels=LIMIT, spec=spec)


# name → (JPEG, the model whose [preprocess] it is decoded for); the names are the test ids (the
# bytes themselves made a 1.3 MB id in run 15d's log)
PHOTOS = {
    "500x375": (encode(synthetic_photo(500, 375), quality=90), RESNET50),
    "1920x1080": (encode(synthetic_photo(1920, 1080), quality=90), RESNET50),
    "portrait": (encode(synthetic_photo(375, 500, seed=1), quality=75), RESNET50),
    "progressive": (encode(synthetic_photo(640, 480, seed=2), quality=90, progressive=True), RESNET50),
    "garment": (encode(fashion_photo(GARMENTS[0], 500, 375), quality=90), RESNET50),
    "grey for the seed CNN": (grey_jpeg(GARMENTS[1]), SEED_CNN),
}


@pytest.mark.parametrize(("name", "data", "spec"), [(n, d, s) for n, (d, s) in PHOTOS.items()], ids=list(PHOTOS))
def test_gpu_pixels_agree_with_pillows(name: str, data: bytes, spec: ModelSpec) -> None:
    (got,), _ = decode_all([(data, spec)])
    assert isinstance(got, np.ndarray), got
    want = pillow(data, spec)
    assert got.shape == want.shape == (1, *spec.input_shape) and got.dtype == np.uint8
    difference = np.abs(got.astype(np.int16) - want.astype(np.int16))
    p99 = np.percentile(difference, 99)
    print(f"{name}: mean {difference.mean():.3f} levels, p99 {p99:.0f}, max {difference.max()}")
    assert difference.mean() < MEAN_LEVELS


def test_resnet50_gives_the_same_top1_on_gpu_and_pillow_pixels() -> None:
    photos = [fashion_photo(g, 500, 375, seed=i) for i, g in enumerate(GARMENTS)]
    photos += [synthetic_photo(1920, 1080, seed=3), synthetic_photo(500, 375, seed=4)]
    jpegs = [encode(photo, quality=90) for photo in photos]
    results, _ = decode_all([(data, RESNET50) for data in jpegs])
    gpu = np.concatenate(results)  # type: ignore[arg-type]  # (8, 3, 224, 224) uint8
    cpu = np.concatenate([pillow(data, RESNET50) for data in jpegs])
    module = load_model(RESNET50).module.cuda().eval()  # seeded random weights, fp32
    mean = torch.tensor(RESNET50.preprocess.mean, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(RESNET50.preprocess.std, device="cuda").view(1, 3, 1, 1)
    with torch.inference_mode():
        logits = [module((torch.from_numpy(p).cuda().float() / 255 - mean) / std).cpu().numpy() for p in (cpu, gpu)]
    top2 = np.sort(logits[0], axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 0.05  # as loadtest's min_margin: a near tie may flip on any float path
    assert clear.sum() >= 4, f"too few images with a clear top-1 to compare: margins {top2[:, 1] - top2[:, 0]}"
    np.testing.assert_array_equal(logits[1].argmax(1)[clear], logits[0].argmax(1)[clear])


def test_concurrent_uploads_are_decoded_together_and_each_as_if_alone() -> None:
    jpegs = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(32)]
    together, sizes = decode_all([(data, RESNET50) for data in jpegs])
    assert sizes == [32]
    split, sizes = decode_all([(data, RESNET50) for data in jpegs], max_batch=8)
    assert sizes == [8, 8, 8, 8]
    alone = [decode_all([(data, RESNET50)])[0][0] for data in jpegs[:4]]
    for i in range(4):
        np.testing.assert_array_equal(together[i], alone[i])  # type: ignore[arg-type]
        np.testing.assert_array_equal(split[i], alone[i])  # type: ignore[arg-type]


NVJPEG = ["torchvision", "direct"]  # CGSERVE_JPEG_NVJPEG: whose nvJPEG call, with memory handled each its own way


@pytest.mark.parametrize("priority", ["normal", "high"])  # CGSERVE_JPEG_STREAM_PRIORITY: the same pixels
@pytest.mark.parametrize("nvjpeg", NVJPEG)
def test_two_launches_at_once_give_every_upload_the_pixels_it_gets_alone(nvjpeg: str, priority: str) -> None:
    """Batches of mixed photo sizes launched two at a time, their device memory freed and reused while the
    other batch's resize is still queued (run 22's review: nvJPEG's outputs, once allocated under the
    stream the resizes run on, could take memory a queued resize still read): each of 200 uploads equals
    its own photo decoded one at a time (by a decoder at normal priority), at either stream priority."""
    sizes = [(500, 375), (640, 480), (375, 500), (320, 240), (1024, 768)]
    jpegs = [encode(synthetic_photo(*sizes[i % len(sizes)], seed=i), quality=90) for i in range(40)]
    alone, _ = decode_all([(data, RESNET50) for data in jpegs], max_batch=1, launches=1, nvjpeg=nvjpeg)
    uploads = [(jpegs[i % 40], RESNET50) for i in range(200)]
    together, batch_sizes = decode_all(uploads, max_batch=7, nvjpeg=nvjpeg, priority=priority)
    assert sum(batch_sizes) == 200 and len(batch_sizes) >= 29
    for i, got in enumerate(together):
        assert isinstance(got, np.ndarray), got
        np.testing.assert_array_equal(got, alone[i % 40], err_msg=f"upload {i}")  # type: ignore[arg-type]


def test_launch_threads_past_the_direct_decoder_s_states_wait_for_one_and_get_the_same_pixels() -> None:
    """Five launch threads share DIRECT_STATES decoder states: a thread finding none free waits for one (the
    pool's get), and every upload still gets the pixels it gets alone."""
    jpegs = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(24)]
    alone, _ = decode_all([(data, RESNET50) for data in jpegs], max_batch=1, launches=1, nvjpeg="direct")

    async def run() -> list[object]:
        decoder = GpuJpegDecoder("cuda:0", max_batch=3, launches=5, nvjpeg="direct")
        assert decoder.launches == 5 and decoder._direct is not None
        assert decoder._direct.qsize() == DIRECT_STATES < 5
        try:
            return list(await asyncio.gather(*(decoder.decode(jpegs[i % 24], RESNET50) for i in range(120))))
        finally:
            decoder.close()

    for i, got in enumerate(asyncio.run(run())):
        np.testing.assert_array_equal(got, alone[i % 24], err_msg=f"upload {i}")  # type: ignore[arg-type]


@pytest.mark.parametrize("nvjpeg", NVJPEG)
def test_one_bad_jpeg_does_not_cost_its_batch_mates(nvjpeg: str) -> None:
    good = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(3)]
    bad = good[0][:1000] + bytes(len(good[0]) - 1002) + good[0][-2:]  # scan zeroed, markers intact
    bad = bad[:1000] + b"\xff\xd0\xff\xc4" + bad[1004:]  # a stray RST and DHT in the scan: Pillow refuses it
    items = [(good[0], RESNET50), (bad, RESNET50), (good[1], RESNET50), (good[2], RESNET50)]
    results, sizes = decode_all(items, nvjpeg=nvjpeg)
    assert sizes == [4]
    for i, data in zip((0, 2, 3), good, strict=True):
        assert isinstance(results[i], np.ndarray), results[i]
        assert np.abs(results[i].astype(np.int16) - pillow(data, RESNET50)).mean() < MEAN_LEVELS  # type: ignore[union-attr]
    # Refused (then Pillow answers it 422, as tests/unit/test_image_upload.py shows) or decoded anyway.
    print(f"nvJPEG on the corrupt scan: {type(results[1]).__name__}")


@pytest.mark.parametrize("nvjpeg", NVJPEG)
def test_pinned_rows_get_the_pixels_of_a_copy_written_by_the_device_even_once_cancelled(nvjpeg: str) -> None:
    """A bulk of rows registered with pin(), each JPEG's bytes at the start of its row as door.c puts them, decoded
    over it (rows in runs with gaps: several copies a batch): each row gets the pixels the decoder's own copy gives,
    written in place by the device. A decode cancelled once taken into a launch still has its row written: settled()
    returns once it has been."""
    jpegs = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(12)]
    rows = [0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 12, 15]

    async def run() -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], int, np.ndarray]:
        decoder = GpuJpegDecoder("cuda:0", max_batch=16, nvjpeg=nvjpeg)
        bulk = np.zeros((16, *RESNET50.input_shape), np.uint8)
        try:
            assert decoder.pin(bulk)
            copies = await asyncio.gather(*(decoder.decode(data, RESNET50) for data in jpegs))
            futures = []
            for data, row in zip(jpegs, rows, strict=True):
                encoded = bulk[row].reshape(-1)[: len(data)]
                encoded[:] = np.frombuffer(data, np.uint8)
                futures.append(decoder.decode(memoryview(encoded), RESNET50, out=bulk[row : row + 1]))
            mine = await asyncio.gather(*futures)
            in_place = decoder.images_in_place
            # Once more, the last one cancelled after its launch took it.
            late = jpegs[0]
            bulk[14].reshape(-1)[: len(late)] = np.frombuffer(late, np.uint8)
            caught_up = asyncio.Event()
            decoder.on_caught_up = caught_up.set  # called once every upload given is in a launch
            future = decoder.decode(memoryview(bulk[14].reshape(-1)[: len(late)]), RESNET50, out=bulk[14:15])
            await caught_up.wait()
            future.cancel()
            await decoder.settled()
            cancelled_row = bulk[14].copy()
            decoder.unpin(bulk)
            return bulk, list(mine), list(copies), in_place, cancelled_row
        finally:
            decoder.close()

    bulk, mine, copies, in_place, cancelled_row = asyncio.run(run())
    assert in_place == len(jpegs)
    for i, (got, want, row) in enumerate(zip(mine, copies, rows, strict=True)):
        assert np.shares_memory(got, bulk[row]), f"upload {i}: not its own row"
        np.testing.assert_array_equal(got, want, err_msg=f"upload {i}")
    np.testing.assert_array_equal(cancelled_row, copies[0][0])
    assert not bulk[[4, 7, 13]].any(), "a run's copy wrote past its rows"


def test_the_hardware_decoder_called_directly_gives_torchvisions_pixels() -> None:
    """Each launch thread's own nvJPEG state (app/codecs/nvjpeg.py) against torchvision's decode_jpeg, for the
    JPEGs uploads bring: chroma subsamplings, grey, odd and tiny sizes, and a progressive one the hardware
    refuses (torchvision decodes it). The same library on the same engines: the same levels."""
    photo = synthetic_photo(500, 375, seed=5)
    jpegs = [
        encode(photo, quality=90),
        encode(photo, quality=90, subsampling=1),  # 4:2:2
        encode(photo, quality=90, subsampling=0),  # 4:4:4
        encode(Image.fromarray(photo).convert("L"), quality=90),  # grey, decoded as RGB for resnet50
        encode(synthetic_photo(333, 251, seed=6), quality=75),
        encode(synthetic_photo(28, 28, seed=7), quality=90),
        encode(photo, quality=90, progressive=True),
    ]
    items = [(data, RESNET50) for data in jpegs] * 3 + [(grey_jpeg(g), SEED_CNN) for g in GARMENTS]
    direct, _ = decode_all(items, max_batch=16, nvjpeg="direct")
    by_torchvision, _ = decode_all(items, max_batch=16)
    for i, (got, want) in enumerate(zip(direct, by_torchvision, strict=True)):
        assert isinstance(got, np.ndarray) and isinstance(want, np.ndarray), (i, got, want)
        np.testing.assert_array_equal(got, want, err_msg=f"upload {i}")


@pytest.mark.parametrize("preallocate", [(500, 375), (320, 240)])  # photos as large, and some larger
def test_preallocated_hardware_states_give_the_pixels_of_states_grown_as_batches_come(
    preallocate: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CGSERVE_JPEG_PREALLOCATE: the direct decoder's states, each sized at start-up for batches of max_batch photos
    of that size, decode batches of several sizes, and photos larger than it, as torchvision does."""
    sized: list[tuple[int, int, int]] = []
    preallocate_state = BatchDecoder.preallocate

    def spy(decoder: BatchDecoder, batch: int, width: int, height: int) -> None:
        sized.append((batch, width, height))
        preallocate_state(decoder, batch, width, height)

    monkeypatch.setattr(BatchDecoder, "preallocate", spy)
    sizes = [(500, 375), (640, 480), (320, 240), (1024, 768)]
    jpegs = [encode(synthetic_photo(*sizes[i % len(sizes)], seed=i), quality=90) for i in range(24)]
    items = [(jpegs[i % 24], RESNET50) for i in range(120)]
    direct, batch_sizes = decode_all(items, max_batch=16, nvjpeg="direct", preallocate=preallocate)
    by_torchvision, _ = decode_all(items, max_batch=16)
    assert sized == [(16, *preallocate)] * 2  # each of the two launches' states, once
    assert len(set(batch_sizes)) > 1, batch_sizes  # batches of several sizes met the preallocated states
    for i, (got, want) in enumerate(zip(direct, by_torchvision, strict=True)):
        assert isinstance(got, np.ndarray) and isinstance(want, np.ndarray), (i, got, want)
        np.testing.assert_array_equal(got, want, err_msg=f"upload {i}")


# The decoder lives with the GPU: in each worker, or in the engine process that the workers send uploads to.
DESIGNS = {
    "per-process": {},
    "engine-process": {"workers": "2", "engine_process": "true"},
    # each worker decodes its own uploads on the GPU and sends the engine process their pixels
    "engine-process-workers-decode": {"workers": "2", "engine_process": "true", "jpeg_decode_in_workers": "true"},
}


JPEG_TYPE = {"content-type": "image/jpeg"}


@pytest.mark.parametrize("design", list(DESIGNS))
def test_the_http_path_with_the_gpu_decoder(design: str, tmp_path: Path) -> None:
    command = (sys.executable, "-m", "app.cli", "serve")
    settings = {"model_repository": str(EXAMPLES), "device": "cuda", "buckets": "1,8", "compile": "none"}
    settings |= DESIGNS[design]
    photos = [fashion_photo(g, 500, 375, seed=i) for i, g in enumerate(GARMENTS)]
    jpegs = [encode(photo, quality=90) for photo in photos]
    truncated = jpegs[0][: len(jpegs[0]) // 3]
    cmyk = encode(Image.fromarray(photos[0]).convert("CMYK"))
    with running_server(tmp_path / "server.log", command=command, jpeg_decoder="gpu", **settings) as url:
        resnet = f"{url}/v1/models/resnet50/predict"

        def upload(data: bytes) -> httpx.Response:
            return httpx.post(resnet, files={"file": ("a.jpg", data, "image/jpeg")}, timeout=60)

        with ThreadPoolExecutor(len(jpegs)) as pool:  # concurrent: they may share an nvJPEG batch
            answers = list(pool.map(upload, jpegs))
        assert [a.status_code for a in answers] == [200] * len(jpegs), answers[0].text
        # The same server's answer to Pillow's pixels sent raw: top-1 equal where it is not a near tie.
        raw = np.concatenate([pillow(data, RESNET50) for data in jpegs]).tobytes()
        reference = httpx.post(resnet, content=raw, headers={"content-type": "application/octet-stream"}, timeout=60)
        for answer, want in zip(answers, reference.json()["predictions"], strict=True):
            top2 = sorted(want["scores"])[-2:]
            if top2[1] - top2[0] > 0.01:
                assert answer.json()["predictions"][0]["label"] == want["label"]
        assert upload(cmyk).status_code == 200  # Pillow's path
        refused = upload(truncated)
        assert refused.status_code == 422 and "could not be decoded as PNG or JPEG" in refused.text
        junk = upload(b"\xff\xd8\xff" + b"junk" * 100)
        assert junk.status_code == 422
        # The same photos each as the whole body (image/jpeg, answered inline): the same decoder, the same answer.
        with ThreadPoolExecutor(len(jpegs)) as pool:
            bodies = list(pool.map(lambda data: httpx.post(resnet, content=data, headers=JPEG_TYPE, timeout=60), jpegs))
        # Other batch mates, so other buckets of an fp16 model: labels equal where not a near tie, scores close.
        for body, multipart in zip(bodies, answers, strict=True):
            assert body.status_code == 200, body.text
            got, want = body.json()["predictions"][0], multipart.json()["predictions"][0]
            top2 = sorted(want["scores"])[-2:]
            if top2[1] - top2[0] > 0.01:
                assert got["label"] == want["label"]
            np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-2)
        # A v2 BYTES input of every photo, one request: decoded as uploads are (with the engine process, all in
        # its UPLOADS frame), its rows in order.
        encoded = [base64.b64encode(data).decode() for data in jpegs]
        body = {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [len(jpegs)], "data": encoded}]}
        v2 = httpx.post(f"{url}/v2/models/resnet50/infer", json=body, timeout=60)
        assert v2.status_code == 200, v2.text
        rows = np.array(v2.json()["outputs"][0]["data"], np.float32).reshape(len(jpegs), -1)
        for row, multipart in zip(rows, answers, strict=True):
            np.testing.assert_allclose(row, multipart.json()["predictions"][0]["scores"], atol=1e-2)
        grey = grey_jpeg(GARMENTS[0], quality=95)
        seed = httpx.post(f"{url}/v1/models/fashion-cnn/predict", files={"file": ("g.jpg", grey, "image/jpeg")})
        assert seed.status_code == 200 and seed.json()["predictions"][0]["label"] == 9  # an ankle boot
        exposition = httpx.get(f"{url}/metrics").text
    # Who started a GPU decoder: the one process, the engine process, or it and each of the two workers
    # (the metrics below merge every process's, so they cannot tell the designs apart).
    starts = (tmp_path / "server.log").read_text().count("JPEG uploads are decoded on cuda")
    assert starts == (3 if settings.get("jpeg_decode_in_workers") == "true" else 1)
    gpu_count = _sample(exposition, 'cgserve_image_decodes_total{decoder="gpu"}')
    assert gpu_count == 3 * len(jpegs) + 1 and _sample(exposition, 'cgserve_image_decodes_total{decoder="cpu"}') >= 2
    batches = _sample(exposition, "cgserve_gpu_jpeg_batch_images_count")
    assert batches >= 1
    for stage in ("state_wait", "decode", "prepare", "device", "hand_back"):  # each batch once a stage
        assert _sample(exposition, f'cgserve_gpu_jpeg_stage_seconds_count{{stage="{stage}"}}') == batches
        assert _sample(exposition, f'cgserve_gpu_jpeg_stage_seconds_sum{{stage="{stage}"}}') >= 0


@pytest.mark.parametrize(("nvjpeg", "priority"), [("torchvision", "normal"), ("direct", "high")])
def test_jpeg_bodies_at_the_front_door_get_the_ports_answers(nvjpeg: str, priority: str, tmp_path: Path) -> None:
    """The front door's uploads (app/front_door/images.py): decoded over their rows by the same GPU decoder as the
    port's, so the same answers; the uploads door.c leaves to Pillow, and the bad ones, as the port answers them."""
    command = (sys.executable, "-m", "app.cli", "serve")
    door_port = free_port()
    settings = {"model_repository": str(EXAMPLES), "device": "cuda", "buckets": "1,8", "compile": "none",
                "default_model": "resnet50", "front_door_port": str(door_port), "jpeg_nvjpeg": nvjpeg,
                "jpeg_stream_priority": priority}  # fmt: skip
    photos = [fashion_photo(g, 500, 375, seed=i) for i, g in enumerate(GARMENTS)]
    jpegs = [encode(photo, quality=90) for photo in photos]
    cmyk = encode(Image.fromarray(photos[0]).convert("CMYK"))
    truncated = jpegs[0][: len(jpegs[0]) // 3]
    with running_server(tmp_path / "server.log", command=command, jpeg_decoder="gpu", **settings) as url:
        door = f"http://127.0.0.1:{door_port}/predict"

        def post(target: str, data: bytes) -> httpx.Response:
            return httpx.post(target, content=data, headers=JPEG_TYPE, timeout=60)

        with ThreadPoolExecutor(len(jpegs)) as pool:  # concurrent: one bulk, one nvJPEG batch
            mine = list(pool.map(partial(post, door), jpegs))
        theirs = [post(f"{url}/v1/models/resnet50/predict", data) for data in jpegs]
        for got, want in zip(mine, theirs, strict=True):
            assert got.status_code == want.status_code == 200, got.text
            got_row, want_row = got.json()["predictions"][0], want.json()["predictions"][0]
            top2 = sorted(want_row["scores"])[-2:]
            if top2[1] - top2[0] > 0.01:
                assert got_row["label"] == want_row["label"]
            np.testing.assert_allclose(got_row["scores"], want_row["scores"], atol=1e-2)
        assert post(door, cmyk).status_code == 200  # door.c leaves it to Pillow
        for bad in (truncated, b"\xff\xd8\xff" + b"junk" * 100):
            got, want = post(door, bad), post(f"{url}/v1/models/resnet50/predict", bad)
            assert got.status_code == want.status_code == 422 and got.json() == want.json()
        exposition = httpx.get(f"{url}/metrics").text
    assert _sample(exposition, 'cgserve_image_decodes_total{decoder="gpu"}') >= 2 * len(jpegs)
    log = (tmp_path / "server.log").read_text()
    assert "nvJPEG, batched, " + nvjpeg in log
    pinned = re.search(r"front door: (\d+) of its (\d+) buffers pinned", log)  # jpeg_pinned_rows: all of them
    assert pinned is not None and int(pinned[1]) == int(pinned[2]) > 0, log[-2000:]


def _sample(exposition: str, name: str) -> float:
    lines = [line for line in exposition.splitlines() if line.startswith(name + " ")]
    assert lines, f"{name} is not in /metrics"
    return float(lines[0].split()[-1])
