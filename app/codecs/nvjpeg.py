"""nvJPEG's batched decode on the GPU's JPEG engines, called directly: a decoder state a batch decoding, no lock.

torchvision's decode_jpeg holds one lock for the whole process over a batch and ends it in a
cudaStreamSynchronize of its decoder stream: a process decodes one batch at a time, however many
threads launch, and each batch's wait for the device holds the next one's host work back. Here each
batch decoding has a state of its own (nvjpegJpegState_t) on a stream of its own, so batches decode at
once, and nothing waits on the host for the decode: the caller orders its resize after it with an event.

    BatchDecoder.decode([k JPEG buffers], gray) →
        per image: parse its header, its size, whether the hardware takes it (nvjpeg_headers.c's one call a
            batch, the GIL released; or, with no C compiler, three ctypes calls an image, the GIL held)
        one (sum C·H·W) uint8 block on the device, allocated under the state's stream
        nvjpegDecodeBatched(the supported ones → planes of that block), on the state's stream (GIL released)
      → per image: a (C, H, W) view of the block, or why it was not decoded (UNSUPPORTED: the hardware
        does not take it, a progressive JPEG say; the caller decodes those another way)

The library is the one torchvision loaded (its image extension links it), found in the process's
maps, so that no second copy of nvJPEG is needed. Only the hardware backend is used here
(NVJPEG_BACKEND_HARDWARE: A100, H100, H200 and their kin); where it is not available NvJpeg raises
NvJpegError saying why, and the caller keeps torchvision's decoder.

A batch's headers are read in one call into nvjpeg_headers.c (built once with cc: app/ops/c_library.py), through
CDLL, which gives the GIL up for it. Where it cannot be built the per-image calls go through ctypes' PyDLL, which
keeps the GIL: each is short, and giving the GIL back and taking it again per call makes a batch wait for the event
loop's Python once an image. The batch's initialisation and decode go through CDLL too. What is done per image with the
GIL held is kept to those calls; the rest is done once a batch (the descriptors as one array, a batch
of one size's views in one call), since every launch thread's Python shares the one GIL with the loop.

CGSERVE_JPEG_NVJPEG=auto (the default) takes it for the front door in one process: there, at three launches, it
beat torchvision's decoder in eight of nine calls by 1–10 %, with a shorter tail in all nine (runs 51, 58–60); four
launch threads over its three states did a little more (run 62). The
engine process's multipart uploads keep torchvision's: this one did 7–10 % more photos a second there, with a longer
tail (run 52; bench/results/HISTORY.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from app.ops.c_library import BuildError, built_library

log = logging.getLogger(__name__)

MAX_COMPONENTS = 4  # NVJPEG_MAX_COMPONENT
BACKEND_HARDWARE = 3  # nvjpegBackend_t
OUTPUT_Y, OUTPUT_RGB = 2, 3  # nvjpegOutputFormat_t
CSS_444 = 0  # nvjpegChromaSubsampling_t: the most planes' worth of memory, what preallocate() sizes for
STATUS_NAMES = {
    0: "success",
    1: "not initialized",
    2: "invalid parameter",
    3: "bad JPEG",
    4: "JPEG not supported",
    5: "allocator failure",
    6: "execution failed",
    7: "architecture mismatch (no hardware JPEG decoder on this GPU)",
    8: "internal error",
    9: "implementation not supported",
    10: "incomplete bitstream",
}
UNSUPPORTED = "not a JPEG the hardware decoder takes (progressive, 4:1:1, more than 3 components)"
# Each image's planes start on a 256-byte boundary of the batch's block, as an allocation of their own would.
ALIGN = 256
# libnvjpeg.so.13, torchvision's libnvjpeg.36e11081.so.13; not libnvjpeg2k (JPEG 2000)
LIBRARY_NAME = re.compile(r"^libnvjpeg[.-]")
HEADERS_SOURCE = Path(__file__).with_name("nvjpeg_headers.c")


class NvJpegError(RuntimeError):
    pass


def photo_size(text: str) -> tuple[int, int] | None:
    """CGSERVE_JPEG_PREALLOCATE's "WIDTHxHEIGHT" → (width, height); "0" (or "") → None: no preallocation."""
    width, _, height = text.partition("x")
    return (int(width), int(height)) if height else None


class _Image(ctypes.Structure):  # nvjpegImage_t: a plane pointer and its pitch (bytes a row) a component
    _fields_ = [("channel", ctypes.c_void_p * MAX_COMPONENTS), ("pitch", ctypes.c_size_t * MAX_COMPONENTS)]


# _decode_taken fills a batch's nvjpegImage_t as (k, 8) uint64 words: pointers and sizes of 8 bytes, no padding.
assert ctypes.sizeof(_Image) == 2 * MAX_COMPONENTS * 8, "nvjpegImage_t is not 8 words on this platform"


def find_library() -> str | None:
    """The path of the libnvjpeg this process has loaded (torchvision's image extension links it), else the
    one the linker would find, else None."""
    import torchvision.io  # noqa: F401  loads the image extension, and with it libnvjpeg

    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path (absent: anonymous)
            if len(fields) == 6 and LIBRARY_NAME.match(Path(fields[5]).name) and Path(fields[5]).exists():
                return fields[5]
    except OSError:  # no /proc: not Linux
        pass
    return ctypes.util.find_library("nvjpeg")


@dataclass(frozen=True)
class _Library:
    """The functions used, each bound twice where needed: `held` (PyDLL) keeps the GIL, `released` (CDLL) lets
    it go."""

    held: ctypes.PyDLL
    released: ctypes.CDLL
    path: str


def _check(status: int, what: str) -> None:
    if status != 0:
        raise NvJpegError(f"nvJPEG {what} failed: {STATUS_NAMES.get(status, status)}")


class NvJpeg:
    """One nvJPEG handle on the hardware backend, and the decoder states made from it (one a batch decoding at once).
    NvJpegError where the library is missing or this GPU has no hardware JPEG decoder."""

    def __init__(self, path: str | None = None) -> None:
        path = path or find_library()
        if path is None:
            raise NvJpegError("libnvjpeg was not found (torchvision's image extension did not load one)")
        self.library = _Library(ctypes.PyDLL(path), ctypes.CDLL(path), path)
        held, released = self.library.held, self.library.released
        p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        for lib in (held, released):
            lib.nvjpegCreateEx.argtypes = [i, p, p, ctypes.c_uint, ctypes.POINTER(p)]
            lib.nvjpegDestroy.argtypes = [p]
            lib.nvjpegJpegStateCreate.argtypes = [p, ctypes.POINTER(p)]
            lib.nvjpegJpegStateDestroy.argtypes = [p]
            lib.nvjpegJpegStreamCreate.argtypes = [p, ctypes.POINTER(p)]
            lib.nvjpegJpegStreamDestroy.argtypes = [p]
            lib.nvjpegJpegStreamParseHeader.argtypes = [p, p, sz, p]
            u = ctypes.POINTER(ctypes.c_uint)
            lib.nvjpegJpegStreamGetFrameDimensions.argtypes = [p, u, u]
            lib.nvjpegDecodeBatchedSupported.argtypes = [p, p, ctypes.POINTER(i)]
            lib.nvjpegDecodeBatchedInitialize.argtypes = [p, p, i, i, i]
            lib.nvjpegDecodeBatched.argtypes = [p, p, ctypes.POINTER(p), ctypes.POINTER(sz), ctypes.POINTER(_Image), p]
            with contextlib.suppress(AttributeError):  # an older library: preallocate() says it has not the call
                lib.nvjpegDecodeBatchedPreAllocate.argtypes = [p, p, i, i, i, i, i]
        # nvjpeg_headers.c's loop, given this library's functions; None: the per-image calls through PyDLL
        self.read_headers = headers_reader(released)
        handle = ctypes.c_void_p()
        status = held.nvjpegCreateEx(BACKEND_HARDWARE, None, None, 0, ctypes.byref(handle))
        _check(status, "handle creation on the hardware backend")
        self.handle = handle
        self._decoders: list[BatchDecoder] = []  # destroyed with the handle

    def decoder(self, device: torch.device, priority: int = 0) -> BatchDecoder:
        """A state and stream (at torch.cuda.Stream's `priority`) on `device`, which must be the device this handle
        was made on (current then)."""
        decoder = BatchDecoder(self, device, priority)
        self._decoders.append(decoder)
        return decoder

    def close(self) -> None:
        """Destroy the decoders' states (each once its last batch is done on the device), then the handle."""
        for decoder in self._decoders:
            decoder.close()
        self._decoders.clear()
        self.library.held.nvjpegDestroy(self.handle)


class BatchDecoder:
    """One decoder state and its stream: one batch at a time, from one thread at a time. Its previous batch
    must have been decoded before the next starts (the state's buffers are reused): `decode` waits for that
    batch's own event, asleep, where it has not."""

    def __init__(self, nvjpeg: NvJpeg, device: torch.device, priority: int = 0) -> None:
        self.nvjpeg, self.device = nvjpeg, device
        held = nvjpeg.library.held
        # nvJPEG's work and its output block's allocation
        self.stream = torch.cuda.Stream(device, priority=priority)  # type: ignore[no-untyped-call]
        self._state, self._parsed = ctypes.c_void_p(), ctypes.c_void_p()
        _check(held.nvjpegJpegStateCreate(nvjpeg.handle, ctypes.byref(self._state)), "state creation")
        _check(held.nvjpegJpegStreamCreate(nvjpeg.handle, ctypes.byref(self._parsed)), "stream creation")
        self._previous: torch.cuda.Event | None = None
        self._owner = threading.Lock()  # one batch at a time: a second caller is a fault, not a wait
        # The last decode's wait for this state's previous batch to finish on the device, in seconds: part of
        # cgserve_gpu_jpeg_stage_seconds' decode, observed apart as its state_wait.
        self.waited_s = 0.0

    def close(self) -> None:
        """Destroy the state once its last batch is done on the device (asleep until then)."""
        if self._previous is not None:
            self._previous.synchronize()
        held = self.nvjpeg.library.held
        held.nvjpegJpegStreamDestroy(self._parsed)
        held.nvjpegJpegStateDestroy(self._state)

    def preallocate(self, batch: int, width: int, height: int) -> None:
        """Size the state's buffers for `batch` images of up to width × height now, at start-up, so that a batch
        larger than any before does not make nvJPEG reallocate them in the middle of serving: a cudaFree waits
        for the whole device, the models' queued batches included (DALI and nvImageCodec do the same)."""
        call = getattr(self.nvjpeg.library.released, "nvjpegDecodeBatchedPreAllocate", None)
        if call is None:
            raise NvJpegError(f"this libnvjpeg ({self.nvjpeg.library.path}) has no nvjpegDecodeBatchedPreAllocate")
        status = call(self.nvjpeg.handle, self._state, batch, width, height, CSS_444, OUTPUT_RGB)
        _check(status, f"preallocation for {batch} images of {width}x{height}")

    def decode(
        self, images: list[bytearray | memoryview], gray: bool
    ) -> tuple[list[torch.Tensor | str], torch.cuda.Event]:
        """Each image → its (C, H, W) uint8 view on the device (C 1 if gray, else 3: RGB), or why it was not
        decoded (UNSUPPORTED, or its header's fault). The views are ready once the returned event has
        completed on the device; the caller orders its work after it (Stream.wait_event) and keeps the views
        (and `images`, which nvJPEG may read until then) until its own work on them is done."""
        if not self._owner.acquire(blocking=False):  # a fault of the caller's, not a refusal to fall back from
            raise AssertionError("a BatchDecoder decodes one batch at a time, from one thread")
        try:
            return self._decode(images, gray)
        finally:
            self._owner.release()

    def _decode(
        self, images: list[bytearray | memoryview], gray: bool
    ) -> tuple[list[torch.Tensor | str], torch.cuda.Event]:
        results: list[torch.Tensor | str] = [UNSUPPORTED] * len(images)
        if (read := self.nvjpeg.read_headers) is not None:
            taken = self._headers_in_one_call(read, images, results)
        else:
            taken = self._headers_an_image_at_a_time(images, results)
        # This state's last batch, waited for asleep (a blocking event) and only if not done: a wait gives the GIL up.
        self.waited_s = 0.0
        if self._previous is not None and not self._previous.query():  # type: ignore[no-untyped-call]
            waiting = time.perf_counter()
            self._previous.synchronize()
            self.waited_s = time.perf_counter() - waiting
        done = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        try:
            views = self._decode_taken(taken, gray) if taken else []
        except BaseException:  # what it queued may still read `images`, which the caller reuses once it hears
            done.record(self.stream)
            self._previous = done
            done.synchronize()  # on the error path only: the caller may reuse `images` once it hears of it
            raise
        done.record(self.stream)  # the next batch on this state waits for it
        self._previous = done
        for (index, *_), view in zip(taken, views, strict=True):
            results[index] = view
        return results, done

    def _headers_in_one_call(self, read: Callable[..., None], images: list[bytearray | memoryview],
                             results: list[torch.Tensor | str]) -> list[tuple[int, int, int, int, int]]:  # fmt: skip
        """(index, address, length, height, width) of each image the hardware decodes, read by nvjpeg_headers.c
        (`read`: headers_reader's) in one call with the GIL given up; a header that does not parse says why in
        `results`."""
        k = len(images)
        sizes = [len(image) for image in images]
        lengths = np.array(sizes, np.uint64)
        addresses = np.fromiter((first_byte(image) if n else 0 for image, n in zip(images, sizes, strict=True)),
                                np.uint64, k)  # fmt: skip
        statuses, widths, heights = np.empty(k, np.int32), np.empty(k, np.uint32), np.empty(k, np.uint32)
        read(self.nvjpeg.handle, self._parsed, k, addresses.ctypes.data, lengths.ctypes.data, statuses.ctypes.data,
             widths.ctypes.data, heights.ctypes.data)  # fmt: skip
        for index in np.flatnonzero(statuses > 0).tolist():  # < 0: parsed, the hardware does not take it
            status = int(statuses[index])
            results[index] = f"nvJPEG could not read its header: {STATUS_NAMES.get(status, status)}"
        taken = np.flatnonzero(statuses == 0)
        return list(zip(taken.tolist(), addresses[taken].tolist(), lengths[taken].tolist(), heights[taken].tolist(),
                        widths[taken].tolist(), strict=True))  # fmt: skip

    def _headers_an_image_at_a_time(self, images: list[bytearray | memoryview], results: list[torch.Tensor | str]
                                    ) -> list[tuple[int, int, int, int, int]]:  # fmt: skip
        """_headers_in_one_call's answer through three PyDLL calls an image, the GIL held: where nvjpeg_headers.c
        could not be built."""
        held, handle = self.nvjpeg.library.held, self.nvjpeg.handle
        taken: list[tuple[int, int, int, int, int]] = []
        width, height, supported = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_int()
        by_width, by_height, by_supported = ctypes.byref(width), ctypes.byref(height), ctypes.byref(supported)
        parse, dimensions = held.nvjpegJpegStreamParseHeader, held.nvjpegJpegStreamGetFrameDimensions
        hardware_takes, parsed = held.nvjpegDecodeBatchedSupported, self._parsed
        for index, image in enumerate(images):
            length = len(image)
            address = first_byte(image) if length else 0
            status = parse(handle, address, length, parsed)
            if status != 0:
                results[index] = f"nvJPEG could not read its header: {STATUS_NAMES.get(status, status)}"
                continue
            if dimensions(parsed, by_width, by_height) != 0 or hardware_takes(handle, parsed, by_supported) != 0:
                continue  # UNSUPPORTED: torchvision's decode says what it makes of it
            if supported.value != 0 or not width.value or not height.value:
                continue  # UNSUPPORTED
            taken.append((index, address, length, height.value, width.value))
        return taken

    def _decode_taken(self, taken: list[tuple[int, int, int, int, int]], gray: bool) -> list[torch.Tensor]:
        """The hardware's images, (index, address, length, height, width) each, decoded into one block on the
        state's stream: a (C, H, W) view of it each."""
        released, handle = self.nvjpeg.library.released, self.nvjpeg.handle
        channels = 1 if gray else 3
        sizes = [channels * h * w for _, _, _, h, w in taken]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += (size + ALIGN - 1) // ALIGN * ALIGN
        with torch.cuda.stream(self.stream):
            block = torch.empty(total, dtype=torch.uint8, device=self.device)  # every image's planes
        base = block.data_ptr()
        k = len(taken)
        shapes = [(h, w) for _, _, _, h, w in taken]
        outputs = image_descriptors(base, offsets, shapes, channels)
        addresses = (ctypes.c_void_p * k)(*(address for _, address, _, _, _ in taken))
        lengths = (ctypes.c_size_t * k)(*(length for _, _, length, _, _ in taken))
        # The GIL let go for both: a larger batch than before may have the state free and reallocate its buffers
        # (a wait for the device), and the decode itself takes a batch's host work.
        status = released.nvjpegDecodeBatchedInitialize(handle, self._state, k, 1, OUTPUT_Y if gray else OUTPUT_RGB)
        _check(status, "batch initialisation")
        status = released.nvjpegDecodeBatched(
            handle, self._state, addresses, lengths, outputs, ctypes.c_void_p(self.stream.cuda_stream)
        )
        _check(status, f"batched decode of {k} images")
        return plane_views(block, offsets, shapes, channels)


def headers_reader(released: ctypes.CDLL) -> Callable[..., None] | None:
    """nvjpeg_headers.c's cg_read_headers bound to `released`'s nvJPEG functions: (handle, parsed, k, addresses,
    lengths, statuses, widths, heights), the last five the addresses of (k,) uint64, uint64, int32, uint32, uint32
    arrays. None where it cannot be built (logged): the caller reads headers an image at a time."""
    try:
        path = built_library("nvjpegheaders", (HEADERS_SOURCE,))
        helper = ctypes.CDLL(str(path)).cg_read_headers  # CDLL: the GIL given up for the call
    except (BuildError, OSError, AttributeError) as error:  # no compiler, no cache directory it may write, a cached
        # file that does not load (a noexec mount) or lacks the function: the loop, not the direct decoder, is lost
        log.info("JPEG headers are read an image at a time, holding the GIL: %s", error)
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    helper.argtypes = [p, p, p, p, p, i, p, p, p, p, p]
    helper.restype = None
    names = ("nvjpegJpegStreamParseHeader", "nvjpegJpegStreamGetFrameDimensions", "nvjpegDecodeBatchedSupported")
    functions = [ctypes.cast(getattr(released, name), p).value for name in names]
    return partial(helper, *functions)


# A batch's Python with the GIL held, written once a batch where it can be (bench/nvjpeg_batch_python.py times each
# against the call an image it replaced): every launch thread's Python shares the one GIL with the event loop.


def first_byte(image: bytearray | memoryview) -> int:
    """The address of a writable, non-empty buffer's first byte. Through c_char: `c_ubyte * len(image)` would make
    an array type for each new length, and every upload has its own."""
    return ctypes.addressof(ctypes.c_char.from_buffer(image))


def image_descriptors(
    base: int, offsets: list[int], shapes: list[tuple[int, int]], channels: int
) -> ctypes.Array[_Image]:
    """One nvjpegImage_t an image: its `channels` planes of (H, W) at base + its offset, one after the other, each row
    W bytes; filled as a (k, 8) array of words (channel pointers, then pitches, 4 of each) rather than a field at a
    time through ctypes."""
    k = len(shapes)
    outputs = (_Image * k)()
    words = np.frombuffer(memoryview(outputs).cast("B"), dtype=np.uint64).reshape(k, 2 * MAX_COMPONENTS)
    heights, widths = np.array(shapes, dtype=np.uint64).reshape(k, 2).T  # (k,) each
    starts = np.uint64(base) + np.array(offsets, dtype=np.uint64)
    for c in range(channels):  # planar: C planes of H rows of W
        words[:, c] = starts + np.uint64(c) * heights * widths
        words[:, MAX_COMPONENTS + c] = widths
    return outputs


def plane_views(block: torch.Tensor, offsets: list[int], shapes: list[tuple[int, int]], channels: int
                ) -> list[torch.Tensor]:  # fmt: skip
    """A (C, H, W) view of `block` an image, at its offset. Images of one size (one camera, one client) are
    ALIGN-padded alike, so their views come from one view of the block, in one call."""
    if len(set(shapes)) == 1:
        k, (h, w) = len(shapes), shapes[0]
        padded = block.numel() // k  # an image's planes, then its padding to ALIGN
        return list(block.view(k, padded)[:, : channels * h * w].view(k, channels, h, w).unbind(0))
    return [  # a view an image, each a torch call with the GIL held
        block[offset : offset + channels * h * w].view(channels, h, w)
        for offset, (h, w) in zip(offsets, shapes, strict=True)
    ]
