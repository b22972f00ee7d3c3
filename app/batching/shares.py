"""Requests waiting in the batcher, and their shares of a batch: packed into a slot, answered from it.

A request is packed row by row, so one larger than the largest bucket (or one that straddles a
full batch) has a share in several batches; its answer is complete once every row came back.

Pixels stay small: a batch whose requests all brought uint8 pixels is staged as uint8 (the
engine casts on the device); one that mixes in float requests is staged as float32, the uint8
rows scaled to [0, 1] on the way in.

Staging is a memcpy into the slot's pinned memory: nothing for the seed CNN (a full batch of 128
is 100 KB), but 19 MB for resnet50 (128 × 3 × 224 × 224 uint8), ~2 ms that the event loop would
not read, batch or hand back anything else; with several GPUs fed by one loop that becomes the
ceiling. Large batches are therefore staged on a thread, a request's rows at a time, a small request's holding the
GIL: a batch of 128 one-image requests is 128 copies, and giving the GIL up for each waited for the loop's Python
every time (app/ops/held_copy.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from app.engines.base import InputDtype, Slot
from app.ops.held_copy import copy_holding_gil


@dataclass(slots=True, eq=False)
class PendingRequest:
    images: np.ndarray  # (k, C, H, W) uint8 pixels or float32 intensities in [0, 1]
    probabilities: np.ndarray  # (k, num_classes) float32, filled share by share
    future: asyncio.Future[np.ndarray]
    enqueued: float  # time.monotonic()
    deadline: float
    next_row: int = 0  # rows [0, next_row) have been launched
    answered_rows: int = 0

    @property
    def rows(self) -> int:
        return len(self.images)


# (request, first row, end row) of one request's share of a batch.
Share = tuple[PendingRequest, int, int]

# Below this a thread hop (tens of µs) costs more than the copy it saves the loop.
STAGE_OFF_LOOP_BYTES = 2 * 2**20
# At normal priority, unlike the decode pool: staging is on every large batch's critical path.
_stager = ThreadPoolExecutor(max_workers=4, thread_name_prefix="stage")


async def stage_rows(shares: list[Share], slot: Slot) -> InputDtype:
    """`stage`, on a thread when the batch is large; returns the staging dtype."""
    size = sum(request.images[start:end].nbytes for request, start, end in shares)
    if size < STAGE_OFF_LOOP_BYTES:
        return stage(shares, slot)
    return await asyncio.get_running_loop().run_in_executor(_stager, stage, shares, slot)


def stage(shares: list[Share], slot: Slot) -> InputDtype:
    """Write the shares' rows, in order, into the slot's staging array; returns its dtype."""
    dtype = staging_dtype(shares)
    staging = slot.inputs[dtype]  # (max_bucket, C, H, W)
    offset = 0
    for request, start, end in shares:
        rows_in = request.images[start:end]
        if rows_in.dtype == staging.dtype:  # a copy a request: made holding the GIL (app/ops/held_copy.py)
            copy_holding_gil(staging[offset : offset + end - start], rows_in)
        else:  # uint8 pixels riding in a float32 batch
            np.multiply(rows_in, np.float32(1 / 255), out=staging[offset : offset + end - start])
        offset += end - start
    # Rows past the batch keep whatever an earlier batch left there: every row of a batch is
    # computed independently (test_padding_rows_never_change_real_rows, tests/unit and tests/gpu),
    # so stale padding cannot leak.
    return dtype


def answer(shares: list[Share], outputs: np.ndarray) -> None:
    """Copy each share's rows out of `outputs` (max_bucket, classes), before the slot is reused;
    a request is answered once all its rows are back."""
    offset = 0
    for request, start, end in shares:
        n = end - start
        if not request.future.done():
            request.probabilities[start:end] = outputs[offset : offset + n]
            request.answered_rows += n
            if request.answered_rows == request.rows:
                request.future.set_result(request.probabilities)
        offset += n


def fail(shares: list[Share], error: Callable[[], Exception]) -> None:
    """An error of its own (a raised exception collects its awaiter's traceback) for every request
    of a batch that has no answer yet."""
    for request, _, _ in shares:
        if not request.future.done():
            request.future.set_exception(error())


def staging_dtype(shares: list[Share]) -> InputDtype:
    """uint8 when every request of the batch brought pixels: a quarter of the bytes to the device."""
    return "uint8" if all(request.images.dtype == np.uint8 for request, _, _ in shares) else "float32"
