"""A bulk's image uploads decoded over their own rows, in place, handed on a decoder batch at a time.

door.c puts an upload's encoded bytes (POST /predict, Content-Type image/jpeg or image/png, at most C×H×W
bytes) at the start of its row of the bulk, and says which are JPEGs nvJPEG takes (door.py's JPEG: the
service's port's test, gpu_decodable, made in C on the door's threads). Those go to the GPU decoder, each row
its own `out`: the decoder reads the bytes, and only once its batch is done writes the (C, h, w) pixels over
them. The others, and any nvJPEG refuses, go to Pillow on the decode pool, which decodes them or says what is
wrong with them exactly as the service's port does.

The rows are handed on as their decodes end, not once the whole bulk's have: a bulk of several hundred photos
is several decoder batches, and its first batch's rows can be on the GPU while its last is decoded, as the
engine process's path queues each upload's rows once they are decoded. A decoder batch hands back all its
futures in one turn of the loop, so each batch's rows come out together. Rows that waited for their whole bulk
reached the batcher all at once, and the device waited between bulks (bench/results/HISTORY.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from app.codecs.bodies import decode_image
from app.codecs.uploads import JpegBatchDecoder, PacedDecoder, RowWritingDecoder
from app.errors import GpuDecodeError
from app.front_door.door import JPEG
from app.ops import metrics
from app.ops.off_loop import off_loop
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)


@dataclass
class Decoded:
    """Rows whose decodes have ended since the last: those now holding their pixels, and those that could not be
    decoded, with why (an InputError: answered as the port would)."""

    rows: list[int] = field(default_factory=list)
    failed: dict[int, Exception] = field(default_factory=dict)


class BulkImages:
    def __init__(self, decoder: JpegBatchDecoder | None, max_pixels: int,
                 caught_up: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.decoder = decoder  # None: Pillow decodes every upload
        self.max_pixels = max_pixels  # CGSERVE_MAX_IMAGE_PIXELS (0: each model's own limit)
        # The decoder, where it says when it has caught up (the GPU's): `caught_up` is called each time it has.
        self.paced = decoder if isinstance(decoder, PacedDecoder) else None
        if self.paced is not None:
            self.paced.on_caught_up = caught_up
        # The decoder, where its device may write a row after its decode was cancelled (a pinned row's copy).
        self.row_writer = decoder if isinstance(decoder, RowWritingDecoder) else None

    async def decode(self, rows: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, images: np.ndarray,
                     spec: ModelSpec) -> AsyncGenerator[Decoded, None]:  # fmt: skip
        """Rows `images` of `rows` (k, C, h, w) uint8, each `lengths[i]` encoded bytes at its start, decoded into
        their pixels; yields them as their decodes end, a decoder batch's together, until every one has."""
        ended: list[tuple[int, asyncio.Future[object]]] = []  # (row, its decode), since the last yield
        turn = asyncio.Event()  # set by the first decode to end after the last yield
        running: dict[int, asyncio.Future[object]] = {}
        on_gpu: set[int] = set()  # the rows the GPU decoder has: counted by the decoder that gave their pixels

        def start(i: int, decode: Awaitable[object]) -> None:
            def on_end(done: asyncio.Future[object]) -> None:
                ended.append((i, done))
                turn.set()

            running[i] = future = asyncio.ensure_future(decode)
            future.add_done_callback(on_end)

        try:
            for i in images.tolist():
                if self.decoder is not None and kinds[i] == JPEG:
                    on_gpu.add(i)
                    # The decoder's future, no task an image: it reads the row's bytes until its batch is launched,
                    # and writes the pixels over them once that batch is done.
                    out = rows[i : i + 1]
                    start(i, self.decoder.decode(memoryview(rows[i].reshape(-1)[: lengths[i]]), spec, out=out))
                else:
                    metrics.IMAGE_DECODES.labels(decoder="cpu").inc()
                    start(i, self._pillow(rows, int(lengths[i]), i, spec))
            while running:
                await turn.wait()
                turn.clear()
                batch, finished = Decoded(), ended[:]
                ended.clear()
                for i, done in finished:
                    del running[i]
                    error = done.exception()  # a cancelled decode raises here: the bulk is being stopped
                    if isinstance(error, GpuDecodeError):  # nvJPEG would not take it after all: Pillow's, as the port
                        log.debug("nvJPEG refused an upload at the front door, Pillow decodes it: %s", error)
                        metrics.IMAGE_DECODES.labels(decoder="cpu_fallback").inc()
                        on_gpu.discard(i)
                        start(i, self._pillow(rows, int(lengths[i]), i, spec))
                    elif isinstance(error, Exception):
                        batch.failed[i] = error
                    elif error is not None:  # KeyboardInterrupt, SystemExit: not the upload's to answer
                        raise error
                    else:
                        batch.rows.append(i)
                # Counted as the port counts an upload: by the decoder that gave its pixels.
                if gpu := sum(i in on_gpu for i in batch.rows):
                    metrics.IMAGE_DECODES.labels(decoder="gpu").inc(gpu)
                if batch.rows or batch.failed:
                    yield batch
        finally:  # stopped (the server is closing, or the caller closed it early): no decode writes a row after this
            on_gpu_cancelled = any(i in on_gpu for i in running)
            for future in [*running.values(), *(done for _, done in ended)]:
                if not future.cancel() and not future.cancelled():
                    future.exception()  # ended and not looked at: read, so that asyncio does not log it as lost
            if on_gpu_cancelled and self.row_writer is not None:  # a launched batch's copy may still write its row
                await self.row_writer.settled()

    async def _pillow(self, rows: np.ndarray, length: int, i: int, spec: ModelSpec) -> None:
        encoded = rows[i].reshape(-1)[:length].tobytes()  # a copy: the pixels are written over the row
        pixels = spec.max_image_pixels(self.max_pixels)
        rows[i] = (await off_loop(decode_image, encoded, max_pixels=pixels, spec=spec))[0]
