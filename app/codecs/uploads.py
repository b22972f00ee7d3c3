"""Which decoder an image upload takes: the batched GPU JPEG decoder or Pillow on the decode pool.

Chosen once at start-up (CGSERVE_JPEG_DECODER), then per upload from its header alone, read on
the event loop (Pillow's open() parses markers, no pixels: tens of µs): a baseline or
progressive JPEG in YCbCr or grey goes to the GPU; PNG, CMYK/YCCK JPEGs, anything Pillow cannot
identify, JPEGs cut short, and every JPEG the GPU decoder gives back (nvJPEG refused it) go to Pillow, which
answers them exactly as before: pixels, or the same 413/422. The pixel limit is checked from the
header before either decoder sees a pixel.

Where the GPU is another process's (an HTTP worker of the engine process), a request whose images
are all JPEGs the GPU takes is not decoded here: its encoded images go to the engine process with
the request (`upload_images` gives the data plane an Uploads in place of pixels), to be decoded and
inferred there in one trip; the engine process sends them back to Pillow here where nvJPEG refuses
one of them (that request alone).
"""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol, cast, runtime_checkable

import numpy as np
from PIL import Image, UnidentifiedImageError

from app.codecs.bodies import MAX_JPEG_SCANS, check_image_size, decode_image, jpeg_scans
from app.errors import GpuDecodeError, InputError
from app.ops import metrics
from app.ops.off_loop import off_loop
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)

# What nvJPEG decodes to RGB or grey the way Pillow does; CMYK and YCCK (Adobe) JPEGs it does not.
GPU_JPEG_MODES = ("RGB", "L")
JPEG_END = b"\xff\xd9"  # EOI; byte stuffing keeps it out of the entropy-coded data


class JpegBatchDecoder(Protocol):
    def decode(
        self, data: bytes | bytearray | memoryview, spec: ModelSpec, out: np.ndarray | None = None
    ) -> Awaitable[np.ndarray]:
        """A JPEG → (1, C, H, W) uint8 per the spec's [preprocess], written into `out` where given;
        GpuDecodeError if nvJPEG refused it. A future (the GPU decoder's) or a coroutine."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class PacedDecoder(JpegBatchDecoder, Protocol):
    """A JpegBatchDecoder that says when it has caught up: the front door takes a bulk of JPEGs then, whatever else
    it has out (app/front_door/feeder.py), so that uploads gather in its C side while the decoder is behind."""

    # Called on the loop (call_soon) each time every upload given to `decode` has been taken into a launch.
    on_caught_up: Callable[[], None] | None
    launches: int  # batches launched at once: the front door keeps room for about two bulks of JPEGs a launch

    def backlog(self) -> int:
        """Uploads given to `decode` and not yet taken into a launch."""
        ...


@runtime_checkable
class RowWritingDecoder(JpegBatchDecoder, Protocol):
    """A JpegBatchDecoder whose device writes an upload's pixels straight into its `out` where that is a row of an
    array registered with `pin` (pinned host memory: app/codecs/pinned_rows.py): the front door pins its bulks."""

    def pin(self, rows: np.ndarray) -> bool:
        """Register `rows`, (n, C, h, w) uint8; False where it could not (logged): its rows are copied into."""
        ...

    def unpin(self, rows: np.ndarray) -> None: ...

    async def settled(self) -> None:
        """Once no batch launched so far can still write an `out` (one whose decode was cancelled among them)."""
        ...

    def abandon_pinned(self) -> None:
        """The pinned arrays stay registered and their copies unwaited for, `close` too: a launched batch outlasted
        the caller's wait for it (a device that does not answer), and the process is ending."""
        ...


class Uploads(Protocol):
    """Encoded images that go to their batcher undecoded, to be decoded where it runs."""

    def enqueue(self, queue: object, deadline: float) -> asyncio.Future[np.ndarray]:
        """The future of their (k, classes) float32 scores, from the model `queue` admitted them on."""
        ...


Images = np.ndarray | Uploads  # what a codec's decode gives the data plane (app/batching/queue.py's enqueue)


# Pillow's (k, C, H, W) pixels for a request's JPEGs the engine process handed back (nvJPEG refused one).
DecodeHere = Callable[[], Awaitable[np.ndarray]]


class DeferringDecoder(Protocol):
    """The GPU decoder of the process that runs the batches (app/engine_process/client.py's
    RemoteJpegDecoder): a request's JPEGs are decoded there with its inference."""

    def defer(self, encoded: Sequence[bytes | bytearray], spec: ModelSpec, decode_here: DecodeHere) -> Uploads | None:
        """The JPEGs as Uploads (None where that process cannot take them now: decode them here);
        `decode_here` gives their pixels where it hands them back (nvJPEG refused one)."""
        ...

    def close(self) -> None: ...


def choose_jpeg_decoder(setting: str, device: str, *, torchvision_imports: bool) -> Literal["cpu", "gpu"]:
    """auto → gpu where the models' device is CUDA and torchvision imports; gpu without them → ValueError."""
    if setting not in ("auto", "cpu", "gpu"):
        raise ValueError(f"jpeg_decoder must be auto, cpu or gpu; got {setting!r}")
    cuda = device.startswith("cuda")
    if setting == "gpu" and not cuda:
        raise ValueError(f"jpeg_decoder gpu needs the models on a CUDA device; they run on {device}")
    if setting == "gpu" and not torchvision_imports:
        raise ValueError(
            "jpeg_decoder gpu needs torchvision (.venv/bin/pip install -e '.[torchvision]'), which does not "
            "import here; or set jpeg_decoder cpu"
        )
    return "gpu" if setting == "gpu" or (setting == "auto" and cuda and torchvision_imports) else "cpu"


def start_jpeg_decoder(
    setting: str, device: str, *, max_batch: int, launches: int, nvjpeg: str, priority: str, preallocate: str = "0"
) -> JpegBatchDecoder | None:
    """The GPU decoder the setting and device call for (batches of at most `max_batch` uploads, `launches`
    of them launched at once, nvJPEG called as `nvjpeg` says: CGSERVE_JPEG_NVJPEG, its streams at `priority`:
    CGSERVE_JPEG_STREAM_PRIORITY, the direct decoder's states sized for photos of `preallocate`, WIDTHxHEIGHT or
    0: CGSERVE_JPEG_PREALLOCATE), or None for Pillow alone."""
    torchvision_imports = device.startswith("cuda") and _imports("torchvision.io")
    if choose_jpeg_decoder(setting, device, torchvision_imports=torchvision_imports) == "cpu":
        return None
    from app.codecs.gpu_jpeg import GpuJpegDecoder  # torchvision and CUDA only from here on
    from app.codecs.nvjpeg import photo_size

    size = photo_size(preallocate)
    decoder = GpuJpegDecoder(
        device, max_batch=max_batch, launches=launches, nvjpeg=nvjpeg, priority=priority, preallocate=size
    )
    log.info("JPEG uploads are decoded on %s (nvJPEG, batched, %s, %s priority)", device, decoder.nvjpeg, priority)
    if size is not None and decoder.nvjpeg != "direct":
        log.warning("CGSERVE_JPEG_PREALLOCATE=%s sizes the direct decoder's states; this one is %s's: ignored",
                    preallocate, decoder.nvjpeg)  # fmt: skip
    return decoder


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception as error:  # not installed, or built for another torch: both mean Pillow
        log.debug("%s does not import: %s", module, error)
        return False
    return True


def gpu_decodable(data: bytes | bytearray, *, max_pixels: int, spec: ModelSpec) -> bool:
    """Whether the header says nvJPEG can take this upload; raises the 413 of an oversized image."""
    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as image:
            check_image_size(image.size, max_pixels=max_pixels, spec=spec)
            # A JPEG cut short (no end-of-image marker) goes to Pillow, which refuses it as before:
            # nvJPEG's hardware decoder would fill in the missing rows without a word.
            # A progressive one of too many scans too: its Huffman phase runs on a launch thread's CPU.
            return (
                image.format == "JPEG"
                and image.mode in GPU_JPEG_MODES
                and data.rfind(JPEG_END) > 0
                and not (image.info.get("progressive") and jpeg_scans(data) > MAX_JPEG_SCANS)
            )
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False  # Pillow's decode_image says what is wrong with it


async def decode_upload(
    data: bytes | bytearray, *, max_pixels: int, spec: ModelSpec, gpu: JpegBatchDecoder | None
) -> np.ndarray:
    """An uploaded image → (1, C, H, W) uint8, on the GPU where it can be, else with Pillow."""
    if gpu is not None and data and gpu_decodable(data, max_pixels=max_pixels, spec=spec):
        try:
            pixels = await gpu.decode(data, spec)
        except GpuDecodeError as error:
            log.debug("nvJPEG refused an upload, Pillow decodes it: %s", error)
            metrics.IMAGE_DECODES.labels(decoder="cpu_fallback").inc()
        else:
            metrics.IMAGE_DECODES.labels(decoder="gpu").inc()
            return pixels
    else:
        metrics.IMAGE_DECODES.labels(decoder="cpu").inc()
    return await off_loop(decode_image, data, max_pixels=max_pixels, spec=spec)


async def decode_uploads(
    encoded: Sequence[bytes | bytearray], *, max_pixels: int, spec: ModelSpec, gpu: JpegBatchDecoder | None
) -> np.ndarray:
    """Several encoded images (a v2 BYTES input) → (k, C, H, W) uint8, each as an upload is decoded; the
    GPU decoder batches those that arrive together."""
    if len(encoded) == 1:  # one upload (POST /predict's, most often): no gather, and no place to name
        return await decode_upload(encoded[0], max_pixels=max_pixels, spec=spec, gpu=gpu)
    count = len(encoded)
    pixels = await asyncio.gather(
        *(_decode_element(i, count, data, max_pixels=max_pixels, spec=spec, gpu=gpu) for i, data in enumerate(encoded))
    )
    return np.concatenate(pixels)


async def _decode_element(i: int, count: int, data: bytes | bytearray, *, max_pixels: int, spec: ModelSpec,
                          gpu: JpegBatchDecoder | None) -> np.ndarray:  # fmt: skip
    """decode_upload of element `i` of `count`, its refusal saying which it was."""
    try:
        return await decode_upload(data, max_pixels=max_pixels, spec=spec, gpu=gpu)
    except InputError as error:
        raise InputError(f"element {i} of the {count}: {error.message}", expected=error.expected,
                         status=error.status, code=error.code) from None  # fmt: skip


async def upload_images(
    encoded: Sequence[bytes | bytearray],
    *,
    max_pixels: int,
    spec: ModelSpec,
    gpu: JpegBatchDecoder | DeferringDecoder | None,
) -> Images:
    """A request's encoded images (an upload, a v2 BYTES input) → (k, C, H, W) uint8 decoded here; or,
    where the GPU decoder is the engine process's and every image is a JPEG it takes, the images
    themselves for it to decode and infer (one trip there, not one to decode and one to infer)."""
    if hasattr(gpu, "defer"):  # a DeferringDecoder (isinstance on a runtime Protocol costs µs a request)
        gpu = cast(DeferringDecoder, gpu)
        if encoded and all(data and gpu_decodable(data, max_pixels=max_pixels, spec=spec) for data in encoded):

            async def decode_here() -> np.ndarray:  # the engine process's nvJPEG refused one of them
                metrics.IMAGE_DECODES.labels(decoder="cpu_fallback").inc(len(encoded))
                # All at once on the decode pool, as decode_uploads does: handed back under load, not one by one.
                pixels = await asyncio.gather(
                    *(off_loop(decode_image, data, max_pixels=max_pixels, spec=spec) for data in encoded)
                )
                return np.concatenate(pixels)

            deferred = gpu.defer(encoded, spec, decode_here)
            if deferred is not None:
                return deferred
        gpu = None  # the rest, Pillow's here
    return await decode_uploads(encoded, max_pixels=max_pixels, spec=spec, gpu=gpu)
