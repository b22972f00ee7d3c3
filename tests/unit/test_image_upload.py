"""Which decoder an upload takes, and the fall-back to Pillow: no GPU or torchvision needed.

A fake batch decoder stands in for app/codecs/gpu_jpeg.py (tests/gpu/test_gpu_jpeg.py runs the real one).
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from app.codecs.bodies import MAX_JPEG_SCANS, decode_image
from app.codecs.uploads import choose_jpeg_decoder, decode_upload, gpu_decodable, start_jpeg_decoder
from app.config import Settings
from app.errors import GpuDecodeError, InputError
from app.ops import metrics
from app.repository import read_repository
from app.repository.model_spec import ModelSpec
from loadtest.photos import encode, synthetic_photo
from tests.hostile_images import scan_bomb, scan_bomb_hiding_its_frame, with_scan_markers_before_its_frame

EXAMPLES = Path(__file__).resolve().parents[2] / "models" / "examples" / "repository"
RESNET50 = next(spec for spec in read_repository(EXAMPLES) if spec.name == "resnet50")
LIMIT = 1024 * 1024
PHOTO = synthetic_photo(500, 375)
JPEG = encode(PHOTO, quality=90)


class FakeGpu:
    """Records what reached it; answers zeros, or refuses everything as nvJPEG refuses a bad JPEG."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.seen: list[bytes] = []

    async def decode(self, data: bytes, spec: ModelSpec) -> np.ndarray:
        self.seen.append(data)
        if self.refuse:
            raise GpuDecodeError("Error while decoding JPEG images: nvjpeg status 2")
        return np.zeros((1, *spec.input_shape), dtype=np.uint8)

    def close(self) -> None:
        pass


def upload(data: bytes, gpu: FakeGpu | None) -> np.ndarray:
    return asyncio.run(decode_upload(data, max_pixels=LIMIT, spec=RESNET50, gpu=gpu))


def decodes(decoder: str) -> float:
    return metrics.IMAGE_DECODES.labels(decoder=decoder)._value.get()


@pytest.mark.parametrize(
    ("setting", "device", "torchvision", "chosen"),
    [
        ("auto", "cuda:0", True, "gpu"),
        ("auto", "cuda:1", False, "cpu"),
        ("auto", "cpu", True, "cpu"),
        ("cpu", "cuda:0", True, "cpu"),
        ("gpu", "cuda:0", True, "gpu"),
    ],
)
def test_auto_takes_the_gpu_only_with_cuda_and_torchvision(
    setting: str, device: str, torchvision: bool, chosen: str
) -> None:
    assert choose_jpeg_decoder(setting, device, torchvision_imports=torchvision) == chosen


def test_gpu_without_what_it_needs_says_what_to_change() -> None:
    with pytest.raises(ValueError, match="needs the models on a CUDA device; they run on cpu"):
        choose_jpeg_decoder("gpu", "cpu", torchvision_imports=True)
    with pytest.raises(ValueError, match=r"needs torchvision \(\.venv/bin/pip install -e '\.\[torchvision\]'\)"):
        choose_jpeg_decoder("gpu", "cuda:0", torchvision_imports=False)
    with pytest.raises(ValueError, match="jpeg_decoder gpu needs a CUDA device"):
        Settings(device="cpu", jpeg_decoder="gpu")
    with pytest.raises(ValidationError, match="jpeg_decoder"):
        Settings(jpeg_decoder="nvjpeg")  # type: ignore[arg-type]


def test_on_the_cpu_no_gpu_decoder_starts() -> None:
    assert start_jpeg_decoder("auto", "cpu", max_batch=32, launches=2, nvjpeg="torchvision", priority="normal") is None
    assert start_jpeg_decoder("cpu", "cpu", max_batch=32, launches=2, nvjpeg="torchvision", priority="normal") is None


def test_the_header_sends_baseline_progressive_and_grey_jpegs_to_the_gpu_and_the_rest_to_pillow() -> None:
    grey = synthetic_photo(64, 48)[..., 0]
    cmyk = Image.fromarray(synthetic_photo(64, 48)).convert("CMYK")
    assert gpu_decodable(JPEG, max_pixels=LIMIT, spec=RESNET50)
    assert gpu_decodable(encode(PHOTO, quality=90, progressive=True), max_pixels=LIMIT, spec=RESNET50)
    assert gpu_decodable(encode(grey, quality=90), max_pixels=LIMIT, spec=RESNET50)
    assert not gpu_decodable(encode(cmyk), max_pixels=LIMIT, spec=RESNET50)
    assert not gpu_decodable(encode(PHOTO, "PNG"), max_pixels=LIMIT, spec=RESNET50)
    assert not gpu_decodable(b"not an image", max_pixels=LIMIT, spec=RESNET50)
    assert not gpu_decodable(JPEG[: len(JPEG) // 3], max_pixels=LIMIT, spec=RESNET50)  # cut short: no EOI


def test_cmyk_jpegs_and_pngs_never_reach_the_gpu_and_decode_as_before() -> None:
    gpu = FakeGpu()
    png = encode(PHOTO, "PNG")
    cmyk_jpeg = encode(Image.fromarray(PHOTO).convert("CMYK"))
    for data in (png, cmyk_jpeg):
        np.testing.assert_array_equal(upload(data, gpu), decode_image(data, max_pixels=LIMIT, spec=RESNET50))
    assert gpu.seen == []


def test_a_jpeg_goes_to_the_gpu_decoder_and_is_counted() -> None:
    gpu, before = FakeGpu(), decodes("gpu")
    assert upload(JPEG, gpu).shape == (1, 3, 224, 224)
    assert gpu.seen == [JPEG] and decodes("gpu") == before + 1


def test_a_jpeg_nvjpeg_refuses_is_decoded_by_pillow_instead() -> None:
    gpu, before = FakeGpu(refuse=True), decodes("cpu_fallback")
    np.testing.assert_array_equal(upload(JPEG, gpu), decode_image(JPEG, max_pixels=LIMIT, spec=RESNET50))
    assert gpu.seen == [JPEG] and decodes("cpu_fallback") == before + 1


def test_a_corrupt_jpeg_gets_the_same_answer_with_or_without_the_gpu() -> None:
    # Scan data overwritten, the markers intact: the header sends it to the GPU; a refusal there
    # sends it on to Pillow, whose answer is the one given without a GPU.
    corrupt = JPEG[:1000] + bytes(len(JPEG) - 1002) + JPEG[-2:]
    corrupt = corrupt[:1000] + b"\xff\xd0\xff\xc4" + corrupt[1004:]  # a stray RST and a DHT inside the scan
    gpu = FakeGpu(refuse=True)
    with pytest.raises(InputError) as without_gpu:
        upload(corrupt, None)
    with pytest.raises(InputError) as with_gpu:
        upload(corrupt, gpu)
    assert (with_gpu.value.status, str(with_gpu.value)) == (without_gpu.value.status, str(without_gpu.value))
    assert with_gpu.value.status == 422 and "could not be decoded as PNG or JPEG" in str(with_gpu.value)
    assert gpu.seen == [corrupt]


def test_a_truncated_jpeg_is_left_to_pillow_which_refuses_it() -> None:
    gpu = FakeGpu()
    with pytest.raises(InputError, match="could not be decoded as PNG or JPEG") as refused:
        upload(JPEG[: len(JPEG) // 3], gpu)
    assert refused.value.status == 422 and gpu.seen == []


def test_an_oversized_jpeg_is_refused_from_its_header_before_any_decoder() -> None:
    gpu = FakeGpu()
    with pytest.raises(InputError) as refused:
        asyncio.run(decode_upload(JPEG, max_pixels=500 * 375 - 1, spec=RESNET50, gpu=gpu))
    assert refused.value.status == 413 and "500×375 = 187500 pixels, over the limit of 187499" in str(refused.value)
    assert gpu.seen == []


def test_a_progressive_jpeg_of_too_many_scans_is_refused_before_its_decode() -> None:
    """20,000 scans held a decode thread 7.2 s for one 1024×1024 upload (bench/hostile_images.py); the limit is
    checked on the bytes."""
    gpu = FakeGpu()
    assert upload(scan_bomb(MAX_JPEG_SCANS), gpu).shape == (1, 3, 224, 224)  # at the limit: decoded (on the GPU)
    assert len(gpu.seen) == 1
    bomb = scan_bomb(20_000)
    assert not gpu_decodable(bomb, max_pixels=LIMIT, spec=RESNET50)  # not to a launch thread's Huffman phase
    started = time.perf_counter()
    with pytest.raises(InputError) as refused:
        upload(bomb, gpu)
    assert time.perf_counter() - started < 1.0  # refused before a scan is decoded (decoding takes seconds)
    assert refused.value.status == 422 and "the JPEG has 20000 scans, over the limit of 100" in str(refused.value)
    assert len(gpu.seen) == 1
    # RST markers (no length) before the frame do not hide it and its scans from the count
    hidden = scan_bomb_hiding_its_frame(2_000)
    with pytest.raises(InputError, match="the JPEG has 2000 scans"):
        decode_image(hidden, max_pixels=LIMIT, spec=RESNET50)
    assert not gpu_decodable(hidden, max_pixels=LIMIT, spec=RESNET50)
    # Marker bytes in a segment before the frame (an ICC profile, an EXIF thumbnail) are not its scans
    profiled = with_scan_markers_before_its_frame(scan_bomb(10), MAX_JPEG_SCANS + 50)
    assert gpu_decodable(profiled, max_pixels=LIMIT, spec=RESNET50)
    assert decode_image(profiled, max_pixels=LIMIT, spec=RESNET50).shape == (1, 3, 224, 224)


def test_a_header_past_pillows_own_guard_is_refused_with_the_servers_limit() -> None:
    """Pillow's DecompressionBombError names its own limit (178956970 pixels), not the one the server keeps."""
    huge = bytearray(JPEG)
    frame = huge.index(b"\xff\xc0")
    huge[frame + 5 : frame + 9] = (65535).to_bytes(2, "big") * 2  # height, width
    with pytest.raises(InputError) as refused:
        upload(bytes(huge), None)
    assert refused.value.status == 413
    assert str(refused.value) == f"the image's header declares {65535 * 65535} pixels, over the limit of {LIMIT}"


def test_a_16_bit_grey_png_decodes_as_its_8_bit_twin() -> None:
    """Pillow opens it as I;16, and convert() clipped every value over 255: the image came out nearly white, and a
    model answered it with no error (92 % accuracy → 67 % on Fashion-MNIST: bench/hostile_images.py)."""
    grey = np.random.default_rng(0).integers(0, 256, (48, 64), dtype=np.uint8)
    sixteen = encode(grey.astype(np.uint16) * 257, "PNG")  # 0–255 → 0–65535, as a 16-bit export scales it
    assert Image.open(io.BytesIO(sixteen)).mode == "I;16"
    expected = decode_image(encode(grey, "PNG"), max_pixels=LIMIT, spec=RESNET50)
    np.testing.assert_array_equal(decode_image(sixteen, max_pixels=LIMIT, spec=RESNET50), expected)


def test_an_empty_upload_is_refused_as_before() -> None:
    with pytest.raises(InputError, match="the uploaded file is empty"):
        upload(b"", FakeGpu())
