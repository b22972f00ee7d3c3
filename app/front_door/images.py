"""A bulk's image uploads decoded over their own rows, in place, before the bulk goes to its batcher.

door.c puts an upload's encoded bytes (POST /predict, Content-Type image/jpeg or image/png, at most C×H×W
bytes) at the start of its row of the bulk, and says which are JPEGs nvJPEG takes (door.py's JPEG: the
service's port's test, gpu_decodable, made in C on the door's threads). Those go to the GPU decoder, each row
its own `out`: the decoder reads the bytes, and only once its batch is done writes the (C, h, w) pixels over
them. The others, and any nvJPEG refuses, go to Pillow on the decode pool, which decodes them or says what is
wrong with them exactly as the service's port does. So a bulk of uploads costs Python a decoder job an image
and one task a bulk, where the engine process's path costs a frame, a future and a callback an upload.

Fewer Python calls did not make it the faster path for JPEG (bench/results/HISTORY.md): a bulk's rows wait for
its whole decode, then reach the batcher all at once, where the engine process's path queues each upload's rows
as they are decoded.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from app.codecs.bodies import decode_image
from app.codecs.uploads import JpegBatchDecoder
from app.errors import GpuDecodeError
from app.front_door.door import JPEG
from app.ops import metrics
from app.ops.off_loop import off_loop
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)


class BulkImages:
    def __init__(self, decoder: JpegBatchDecoder | None, max_pixels: int) -> None:
        self.decoder = decoder  # None: Pillow decodes every upload
        self.max_pixels = max_pixels  # CGSERVE_MAX_IMAGE_PIXELS (0: each model's own limit)

    async def decode(self, rows: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, images: np.ndarray,
                     spec: ModelSpec) -> dict[int, Exception]:  # fmt: skip
        """Rows `images` of `rows` (k, C, h, w) uint8, each `lengths[i]` encoded bytes at its start, decoded into
        their pixels; returns the rows that could not be, with why (an InputError: answered as the port would)."""
        on_gpu = [i for i in images.tolist() if kinds[i] == JPEG] if self.decoder is not None else []
        in_pillow = [i for i in images.tolist() if self.decoder is None or kinds[i] != JPEG]
        if in_pillow:
            metrics.IMAGE_DECODES.labels(decoder="cpu").inc(len(in_pillow))
        failed: dict[int, Exception] = {}
        if on_gpu:
            assert self.decoder is not None
            # The decoder's futures, awaited together: no task an image. Each reads its row's bytes until its
            # batch is launched, and writes its pixels over them once that batch is done.
            decodes = [
                self.decoder.decode(memoryview(rows[i].reshape(-1)[: lengths[i]]), spec, out=rows[i : i + 1])
                for i in on_gpu
            ]
            decoded = await asyncio.gather(*decodes, return_exceptions=True)
            # Counted as the port counts an upload: by the decoder that gave its pixels.
            metrics.IMAGE_DECODES.labels(decoder="gpu").inc(sum(not isinstance(d, BaseException) for d in decoded))
            for i, outcome in zip(on_gpu, decoded, strict=True):
                if isinstance(outcome, GpuDecodeError):  # nvJPEG would not take it after all: Pillow's, as at the port
                    log.debug("nvJPEG refused an upload at the front door, Pillow decodes it: %s", outcome)
                    metrics.IMAGE_DECODES.labels(decoder="cpu_fallback").inc()
                    in_pillow.append(i)
                elif isinstance(outcome, Exception):
                    failed[i] = outcome
                elif isinstance(outcome, BaseException):  # cancelled: the server is stopping
                    raise outcome
        pillow = [self._pillow(rows, int(lengths[i]), i, spec) for i in in_pillow]
        for i, done in zip(in_pillow, await asyncio.gather(*pillow, return_exceptions=True), strict=True):
            if isinstance(done, Exception):
                failed[i] = done
            elif isinstance(done, BaseException):
                raise done
        return failed

    async def _pillow(self, rows: np.ndarray, length: int, i: int, spec: ModelSpec) -> None:
        encoded = rows[i].reshape(-1)[:length].tobytes()  # a copy: the pixels are written over the row
        pixels = spec.max_image_pixels(self.max_pixels)
        rows[i] = (await off_loop(decode_image, encoded, max_pixels=pixels, spec=spec))[0]
