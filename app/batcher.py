"""The dynamic batcher: packs concurrent requests into batches of the engine's bucket sizes.

Policy (Triton's dynamic-batcher rule): launch at once when the largest bucket can be filled,
otherwise when the oldest queued request has waited `max_delay_s`. A batch is padded to the
smallest bucket ≥ its rows; requests are packed row by row, so a request larger than the
largest bucket (or one that straddles a full batch) is split and reassembled.

Pipelining: one task collects and launches, holding a free Slot for each batch; up to
`in_flight` batches run at once and a Slot returns to the pool only after its batch's results
were copied out. Every request gets exactly one answer: its probabilities, or an error —
503 when the queue is over its limit, 504 when still queued at its deadline (never launched),
500 when its batch failed or never came back (the reaper's bound, `batch_timeout_s`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from app import metrics
from app.engines.base import Engine, Slot
from app.errors import DeadlineExceededError, EngineError, NotReadyError, QueueFullError

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 0.5


@dataclass(slots=True, eq=False)
class _Request:
    images: np.ndarray  # (k, C, H, W) float32
    probabilities: np.ndarray  # (k, num_classes) float32, filled chunk by chunk
    future: asyncio.Future[np.ndarray]
    enqueued: float  # time.monotonic()
    deadline: float
    next_row: int = 0  # rows [0, next_row) have been launched
    answered_rows: int = 0

    @property
    def rows(self) -> int:
        return len(self.images)


# (request, first row, end row) of one request's share of a batch.
_Share = tuple[_Request, int, int]


class Batcher:
    def __init__(
        self,
        engine: Engine,
        *,
        max_delay_s: float,
        queue_limit: int,
        request_timeout_s: float,
        in_flight: int = 2,
        batch_timeout_s: float = 30.0,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1; got {in_flight}")
        self.engine = engine
        self.max_delay_s = max_delay_s
        self.queue_limit = queue_limit
        self.request_timeout_s = request_timeout_s
        self.in_flight = in_flight
        self.batch_timeout_s = batch_timeout_s
        self.max_bucket = engine.buckets[-1]
        # pad_to[rows] = smallest bucket ≥ rows, for 1 ≤ rows ≤ max_bucket (the padding table).
        buckets = list(engine.buckets)
        self.pad_to = [0] + [buckets[bisect.bisect_left(buckets, rows)] for rows in range(1, self.max_bucket + 1)]
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._wakeup = asyncio.Event()
        self._free_slots: asyncio.Queue[Slot] = asyncio.Queue()
        slots = [engine.new_slot() for _ in range(in_flight)]
        for slot in slots:
            self._free_slots.put_nowait(slot)
        self._num_classes = slots[0].outputs.shape[1]
        self._batches: dict[asyncio.Task[None], tuple[float, list[_Share]]] = {}  # task → (launched, shares)
        self._loop_task: asyncio.Task[None] | None = None
        self._reaper_task: asyncio.Task[None] | None = None
        self._bucket_metrics = {
            b: (
                metrics.BATCHES.labels(bucket=str(b)),
                metrics.PADDING_ROWS.labels(bucket=str(b)),
                metrics.BATCH_COMPUTE.labels(bucket=str(b)),
            )
            for b in engine.buckets
        }

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._collect_and_launch(), name="batcher")
        self._reaper_task = asyncio.create_task(self._reap_forever(), name="batcher-reaper")

    async def stop(self) -> None:
        """Stop launching, answer queued requests 503, and let in-flight batches finish."""
        for task in (self._loop_task, self._reaper_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._loop_task = self._reaper_task = None
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(NotReadyError("the server is shutting down"))
        self._queued_rows = 0
        metrics.QUEUE_DEPTH.set(0)
        await asyncio.gather(*list(self._batches), return_exceptions=True)

    async def submit(self, images: np.ndarray) -> np.ndarray:
        """(k, C, H, W) float32 → (k, num_classes) probabilities, in the order given."""
        rows = len(images)
        if self._queued_rows + rows > self.queue_limit:
            raise QueueFullError(self._queued_rows, self.queue_limit)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        request = _Request(
            images=images,
            probabilities=np.empty((rows, self._num_classes), dtype=np.float32),
            future=loop.create_future(),
            enqueued=now,
            deadline=now + self.request_timeout_s,
        )
        was_empty = not self._queue
        self._queue.append(request)
        self._queued_rows += rows
        metrics.QUEUE_DEPTH.set(self._queued_rows)
        # Wake the collector only when its decision can change: the delay clock starts, or a
        # full batch is ready. Anything else it notices when its timer fires.
        if was_empty or self._queued_rows >= self.max_bucket:
            self._wakeup.set()
        return await request.future

    async def _collect_and_launch(self) -> None:
        while True:
            slot = await self._free_slots.get()
            await self._wait_for_batch()
            shares, rows = self._take_batch()
            if rows == 0:  # everything queued was cancelled or expired
                self._free_slots.put_nowait(slot)
                continue
            task = asyncio.create_task(self._run_batch(slot, shares, rows))
            self._batches[task] = (time.monotonic(), shares)
            task.add_done_callback(self._batches.pop)

    async def _wait_for_batch(self) -> None:
        while self._queued_rows < self.max_bucket:
            if self._queue:
                remaining = self._queue[0].enqueued + self.max_delay_s - time.monotonic()
                if remaining <= 0:
                    return
            self._wakeup.clear()
            if not self._queue:
                await self._wakeup.wait()
                continue
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                return

    async def _reap_forever(self) -> None:
        """Every request gets an answer even when the collector cannot run (no free slot) or a
        launched batch never comes back (a hung device). Off the per-request path: one sweep a
        REAP_INTERVAL_S rather than a timer per request."""
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            self.reap(time.monotonic())

    def reap(self, now: float) -> None:
        for request in self._queue:  # the collector drops them, done, when it next runs
            if request.next_row == 0 and now >= request.deadline and not request.future.done():
                request.future.set_exception(DeadlineExceededError(self.request_timeout_s))
        for launched, shares in self._batches.values():
            if now - launched > self.batch_timeout_s:
                for request, _, _ in shares:
                    if not request.future.done():
                        request.future.set_exception(
                            EngineError(f"the batch did not complete within {self.batch_timeout_s:g} s")
                        )

    def _take_batch(self) -> tuple[list[_Share], int]:
        """Pop up to max_bucket rows off the queue, oldest first; answer expired requests 504."""
        shares: list[_Share] = []
        rows = 0
        now = time.monotonic()
        while self._queue and rows < self.max_bucket:
            request = self._queue[0]
            if request.future.done():  # the client went away or its own timeout fired
                self._queue.popleft()
                self._queued_rows -= request.rows - request.next_row
                continue
            if request.next_row == 0 and now >= request.deadline:
                self._queue.popleft()
                self._queued_rows -= request.rows
                request.future.set_exception(DeadlineExceededError(self.request_timeout_s))
                continue
            if request.next_row == 0:
                metrics.QUEUE_WAIT.observe(now - request.enqueued)
            take = min(request.rows - request.next_row, self.max_bucket - rows)
            shares.append((request, request.next_row, request.next_row + take))
            request.next_row += take
            rows += take
            self._queued_rows -= take
            if request.next_row == request.rows:
                self._queue.popleft()
        metrics.QUEUE_DEPTH.set(self._queued_rows)
        return shares, rows

    async def _run_batch(self, slot: Slot, shares: list[_Share], rows: int) -> None:
        bucket = self.pad_to[rows]
        offset = 0
        for request, start, end in shares:
            slot.inputs[offset : offset + end - start] = request.images[start:end]
            offset += end - start
        # Rows [rows, bucket) keep whatever an earlier batch left there: every row of a batch is
        # computed independently (test_padding_rows_never_change_real_rows, tests/unit and tests/gpu),
        # so stale padding cannot leak.
        batches, padding, compute = self._bucket_metrics[bucket]
        batches.inc()
        padding.inc(bucket - rows)
        metrics.BATCH_ROWS.observe(rows)
        metrics.IN_FLIGHT.inc()
        try:
            seconds = await self.engine.run(slot, bucket)
        except Exception as error:
            log.exception("batch of %d rows (bucket %d) failed; failing its %d requests", rows, bucket, len(shares))
            for request, _, _ in shares:
                if not request.future.done():
                    request.future.set_exception(EngineError(f"{type(error).__name__}: {error}"))
        else:
            compute.observe(seconds)
            offset = 0
            for request, start, end in shares:
                n = end - start
                if not request.future.done():
                    request.probabilities[start:end] = slot.outputs[offset : offset + n]
                    request.answered_rows += n
                    if request.answered_rows == request.rows:
                        request.future.set_result(request.probabilities)
                offset += n
        finally:
            metrics.IN_FLIGHT.dec()
            self._free_slots.put_nowait(slot)
