"""app/codecs/nvjpeg.py's ctypes binding on the CPU, against a stand-in libnvjpeg built here from C.

The stand-in speaks nvJPEG's calls as nvjpeg.h declares them, for "images" of the form b"FAKE <w> <h> <s>"
(s: 0 the hardware takes it, 1 it does not); its batched decode writes 10·i + c + 1 into every pixel of plane c
of the batch's i-th image, through the pointers and pitches it is given, into host memory (the block is a CPU
tensor here: CUDA's streams and events are stood in for). What is tested is ours: the planes' offsets and
pitches, the views over them, the order of the answers, what is refused and why, the statuses checked, and a
failed batch leaving the state usable. tests/gpu/test_gpu_jpeg.py runs the real library against torchvision's.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from app.codecs import nvjpeg
from app.codecs.nvjpeg import UNSUPPORTED, NvJpeg, NvJpegError, photo_size

STAND_IN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned char *channel[4]; size_t pitch[4]; } nvjpegImage_t;
typedef struct { unsigned w, h; int unsupported; } parsed_t;
typedef struct { int k, format; } state_t;

static int parse(const unsigned char *data, size_t length, parsed_t *out) {
    char text[64];
    if (length < 5 || length >= sizeof text || memcmp(data, "FAKE ", 5) != 0) return 3; /* BAD_JPEG */
    memcpy(text, data, length); text[length] = 0;
    return sscanf(text + 5, "%u %u %d", &out->w, &out->h, &out->unsupported) == 3 ? 0 : 3;
}
int nvjpegCreateEx(int backend, void *d, void *p, unsigned flags, void **handle) { *handle = malloc(1); return 0; }
int nvjpegDestroy(void *handle) { free(handle); return 0; }
int nvjpegJpegStateCreate(void *handle, void **state) { *state = calloc(1, sizeof(state_t)); return 0; }
int nvjpegJpegStateDestroy(void *state) { free(state); return 0; }
int nvjpegJpegStreamCreate(void *handle, void **stream) { *stream = calloc(1, sizeof(parsed_t)); return 0; }
int nvjpegJpegStreamDestroy(void *stream) { free(stream); return 0; }
int nvjpegJpegStreamParseHeader(void *handle, const unsigned char *data, size_t length, void *stream) {
    return parse(data, length, stream);
}
int nvjpegJpegStreamGetFrameDimensions(void *stream, unsigned *w, unsigned *h) {
    *w = ((parsed_t *)stream)->w; *h = ((parsed_t *)stream)->h; return 0;
}
int nvjpegDecodeBatchedSupported(void *handle, void *stream, int *unsupported) {
    *unsupported = ((parsed_t *)stream)->unsupported; return 0;
}
int nvjpegDecodeBatchedInitialize(void *handle, void *state, int k, int threads, int format) {
    ((state_t *)state)->k = k; ((state_t *)state)->format = format; return 0;
}
#ifndef WITHOUT_PREALLOCATE /* an older library has not the call */
void *preallocated_state; /* the last call's state and its (batch, width, height, subsampling, format), for the tests */
int preallocated[5];
int nvjpegDecodeBatchedPreAllocate(void *handle, void *state, int k, int w, int h, int css, int format) {
    preallocated_state = state;
    preallocated[0] = k; preallocated[1] = w; preallocated[2] = h; preallocated[3] = css; preallocated[4] = format;
    return k < 1 || w < 1 || h < 1 ? 2 : 0; /* INVALID_PARAMETER, else sized */
}
#endif
int nvjpegDecodeBatched(void *handle, void *state, const unsigned char *const *data, const size_t *lengths,
                        nvjpegImage_t *images, void *stream) {
    int format = ((state_t *)state)->format, planes = format == 2 ? 1 : 3; /* OUTPUT_Y, else OUTPUT_RGB */
    for (int k = 0; k < ((state_t *)state)->k; k++) {
        parsed_t p;
        if (parse(data[k], lengths[k], &p) != 0) return 6;
        if (memcmp(data[k], "FAKE 9 9 0", 10) == 0) return 6; /* a batch the "hardware" fails */
        for (int c = 0; c < planes; c++)
            for (unsigned y = 0; y < p.h; y++)
                memset(images[k].channel[c] + y * images[k].pitch[c], 10 * k + c + 1, p.w);
    }
    return 0;
}
"""


class Event:
    def __init__(self, blocking: bool = False) -> None:
        self.recorded = self.synchronized = 0

    def record(self, stream: object) -> None:
        self.recorded += 1

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.synchronized += 1


@pytest.fixture(params=["headers in one call", "headers an image at a time"])
def library(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The stand-in's path; CUDA's stream, events and contexts stood in for, the block on the CPU. Each test runs
    with the headers read by nvjpeg_headers.c in one call, and as where it cannot be built (three PyDLL calls an
    image)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the stand-in libnvjpeg")
    one_call = request.param == "headers in one call"
    reader = nvjpeg.headers_reader

    def headers_reader(released: ctypes.CDLL) -> object:
        found = reader(released) if one_call else None
        assert (found is not None) == one_call, "nvjpeg_headers.c was not built here, where cc is"
        return found

    monkeypatch.setattr(nvjpeg, "headers_reader", headers_reader)
    source, built = tmp_path / "nvjpeg.c", tmp_path / "libnvjpeg.so.13"
    source.write_text(STAND_IN)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(built), str(source)], check=True)
    older = tmp_path / "older" / "libnvjpeg.so.13"  # the same without nvjpegDecodeBatchedPreAllocate
    older.parent.mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", "-DWITHOUT_PREALLOCATE", "-o", str(older), str(source)], check=True)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device, priority=0: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    yield str(built)


def decode(path: str, images: list[bytes], gray: bool = False) -> list[torch.Tensor | str]:
    handle = NvJpeg(path)
    decoder = handle.decoder(torch.device("cpu"))
    results, done = decoder.decode([bytearray(image) for image in images], gray=gray)
    assert done.recorded == 1
    handle.close()  # its decoder's state, then itself: the stand-in frees them
    return results


def test_each_image_s_planes_are_where_its_view_says_in_order(library: str) -> None:
    results = decode(library, [b"FAKE 5 3 0", b"FAKE 2 4 0", b"FAKE 7 1 0"])
    assert [tuple(r.shape) for r in results] == [(3, 3, 5), (3, 4, 2), (3, 1, 7)]  # type: ignore[union-attr]
    for i, image in enumerate(results):
        assert isinstance(image, torch.Tensor)
        for c in range(3):
            assert (image[c] == 10 * i + c + 1).all(), (i, c, image[c])
        assert image.storage_offset() % nvjpeg.ALIGN == 0  # each image's planes start aligned in the block


@pytest.mark.parametrize("gray", [False, True])
def test_a_batch_of_one_size_gives_the_same_views_as_one_of_many(library: str, gray: bool) -> None:
    # One size: the views come from one call over the block (45 bytes of planes, padded to 256, an image), with a
    # refused image between them as a batch may have.
    results = decode(library, [b"FAKE 5 3 0", b"FAKE 5 3 0", b"FAKE 5 3 1", b"FAKE 5 3 0"], gray=gray)
    channels = 1 if gray else 3
    assert results[2] == UNSUPPORTED
    for i, image in ((0, results[0]), (1, results[1]), (2, results[3])):  # i: its place among the decoded
        assert isinstance(image, torch.Tensor) and tuple(image.shape) == (channels, 3, 5)
        for c in range(channels):
            assert (image[c] == 10 * i + c + 1).all(), (i, c, image[c])
        assert image.storage_offset() == i * nvjpeg.ALIGN and image.is_contiguous()


def test_grey_is_one_plane(library: str) -> None:
    (image,) = decode(library, [b"FAKE 4 2 0"], gray=True)
    assert isinstance(image, torch.Tensor) and image.shape == (1, 2, 4) and (image == 1).all()


def test_what_the_hardware_does_not_take_and_what_does_not_parse_are_said_so_in_place(library: str) -> None:
    results = decode(library, [b"FAKE 3 3 1", b"not a jpeg", b"FAKE 2 2 0", b"", b"FAKE 0 3 0", b"FAKE 4 1 0"])
    assert results[0] == UNSUPPORTED
    assert isinstance(results[1], str) and "could not read its header: bad JPEG" in results[1]
    assert isinstance(results[2], torch.Tensor) and (results[2][0] == 1).all()  # the batch's first decoded
    assert isinstance(results[3], str) and "could not read its header" in results[3]  # empty
    assert results[4] == UNSUPPORTED  # no pixels to decode
    assert isinstance(results[5], torch.Tensor) and tuple(results[5].shape) == (3, 1, 4) and (results[5][0] == 11).all()


def test_a_batch_the_library_fails_is_an_error_and_the_state_decodes_the_next(library: str) -> None:
    decoder = NvJpeg(library).decoder(torch.device("cpu"))
    with pytest.raises(NvJpegError, match="execution failed"):
        decoder.decode([bytearray(b"FAKE 2 2 0"), bytearray(b"FAKE 9 9 0")], gray=False)
    # Waited for before it raised: what it queued may read the images, which the caller reuses once it hears.
    assert decoder._previous is not None and decoder._previous.synchronized == 1  # type: ignore[attr-defined]
    results, _ = decoder.decode([bytearray(b"FAKE 2 2 0")], gray=False)
    assert isinstance(results[0], torch.Tensor) and (results[0] == torch.tensor(1, dtype=torch.uint8)).any()


class Unfinished(Event):
    """A previous batch still on the device: its wait takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        super().synchronize()
        time.sleep(self.seconds)


def test_the_wait_for_the_states_previous_batch_is_said_apart(library: str) -> None:
    """cgserve_gpu_jpeg_stage_seconds' state_wait: the decode call's wait for the state's previous batch, 0 where it
    was done (not waited for)."""
    decoder = NvJpeg(library).decoder(torch.device("cpu"))
    decoder._previous = Unfinished(0.05)  # type: ignore[assignment]
    decoder.decode([bytearray(b"FAKE 2 2 0")], gray=False)
    assert decoder.waited_s >= 0.05
    decoder.decode([bytearray(b"FAKE 2 2 0")], gray=False)  # its previous batch (the stand-ins' Event) is done
    assert decoder.waited_s == 0.0


def test_preallocation_asks_for_the_batch_at_its_size_and_says_what_it_was_refused(library: str) -> None:
    handle = NvJpeg(library)
    decoder = handle.decoder(torch.device("cpu"))
    decoder.preallocate(128, 500, 375)
    held = handle.library.held
    asked = list((ctypes.c_int * 5).in_dll(held, "preallocated"))
    assert asked == [128, 500, 375, nvjpeg.CSS_444, nvjpeg.OUTPUT_RGB]  # 4:4:4 to RGB: the most a photo can need
    assert ctypes.c_void_p.in_dll(held, "preallocated_state").value == decoder._state.value  # its own state
    with pytest.raises(NvJpegError, match="preallocation for 128 images of 0x375 failed: invalid parameter"):
        decoder.preallocate(128, 0, 375)
    results, _ = decoder.decode([bytearray(b"FAKE 2 2 0")], gray=False)  # and the state still decodes
    assert isinstance(results[0], torch.Tensor)


def test_a_library_without_preallocation_still_decodes_and_says_it_has_not_the_call(library: str) -> None:
    older = str(Path(library).parent / "older" / "libnvjpeg.so.13")
    decoder = NvJpeg(older).decoder(torch.device("cpu"))
    with pytest.raises(NvJpegError, match="has no nvjpegDecodeBatchedPreAllocate"):
        decoder.preallocate(128, 500, 375)
    results, _ = decoder.decode([bytearray(b"FAKE 2 2 0")], gray=False)
    assert isinstance(results[0], torch.Tensor)


def test_a_second_caller_of_one_state_is_a_fault_not_a_refusal(library: str) -> None:
    decoder = NvJpeg(library).decoder(torch.device("cpu"))
    with decoder._owner, pytest.raises(AssertionError, match="one batch at a time"):  # another thread's batch
        decoder.decode([bytearray(b"FAKE 2 2 0")], gray=False)


def test_the_library_name_is_nvjpeg_s_not_jpeg_2000_s() -> None:
    for name in ("libnvjpeg.so.13", "libnvjpeg.36e11081.so.13", "libnvjpeg-3c9a3bd2.so.12"):
        assert nvjpeg.LIBRARY_NAME.match(name), name
    assert not nvjpeg.LIBRARY_NAME.match("libnvjpeg2k.so.0")


def test_the_preallocation_setting_reads_as_a_photo_size_or_none() -> None:
    """CGSERVE_JPEG_PREALLOCATE (config.py's pattern has checked it): WIDTHxHEIGHT, or 0 for none."""
    assert photo_size("500x375") == (500, 375)
    assert photo_size("0") is None and photo_size("") is None


def test_without_a_compiler_headers_are_read_an_image_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """nvjpeg_headers.c unbuilt (nothing cached, no cc on PATH): no reader, said in the log, and the decoder reads
    headers through PyDLL (the fixture's second parameter runs every test so)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with caplog.at_level("INFO", logger="app.codecs.nvjpeg"):
        assert nvjpeg.headers_reader(ctypes.CDLL(None)) is None
    assert "an image at a time" in caplog.text and "no C compiler" in caplog.text


def test_a_cached_header_library_that_does_not_load_costs_the_one_call_not_the_decoder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A cached nvjpeg_headers library that does not load (a noexec cache mount, a file cut short): no reader, so the
    decoder reads headers an image at a time, where the OSError would have turned the whole direct decoder off."""
    broken = tmp_path / "nvjpegheaders-0123456789abcdef.so"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setattr(nvjpeg, "built_library", lambda *args, **kwargs: broken)
    assert nvjpeg.headers_reader(ctypes.CDLL(None)) is None
