"""The dynamic batcher: packs concurrent requests into batches of the engine's bucket sizes.

Policy: launch at once when the largest bucket can be filled or when a device is idle (no
batch in flight there: waiting could only add latency, so a lone request goes straight through),
otherwise when the oldest queued request has waited `max_delay_s` (Triton's dynamic-batcher
rule) or a running batch completes and leaves its device idle. With `just_in_time`, a partial
batch for a busy device also waits until that device is about to finish what it has (its
expected end less the staging time, app/batching/device_clock.py): launched sooner it would
only wait there while the requests arriving meanwhile could not join it. Under load the devices
are busy, so batches fill while they work; at low load nothing waits for company that is not coming. A
batch is padded to the smallest bucket ≥ its rows; requests are packed row by row, so a request
larger than the largest bucket (or one that straddles a full batch) is split and reassembled
(app/batching/shares.py).

How many rows a batch takes: everything queued, up to the largest bucket. With `fastest_bucket`
(opt-in), a batch for a busy device takes only as many as the bucket that computes the most rows a
device second holds, by the batches measured (DeviceClock.estimate_s): on the H200 80 queued
ResNet-50 rows padded to 128 take 5.96 ms (13 rows a ms), a full 64 takes 3.27 ms (20 a ms), so 64
go and the 16 left lead the next batch, as Triton's preferred batch sizes would have it. Where a
batch's time hardly grows with its rows (the seed CNN), the largest bucket still wins. It pays
only where the device is the limit; where the front end is, it only makes the batches smaller
(docs/tuning.md), hence opt-in.

Pipelining and devices: one task collects and launches while a free Slot exists; each engine
(one per device, all of the same model and buckets) has one Slot per batch in flight (its
`in_flight`), the SlotPool gives each batch the free slot of the least-loaded device, and a
Slot returns to the pool only after its batch's results were copied out.

Every request gets exactly one answer: its probabilities, or an error — 503 when the queue is over its limit
(checked before the body is read, `admit`, and again at `enqueue`), 504 when its end-to-end deadline passes
before its rows are launched (the rows of a split request left unlaunched are dropped), 500 when its batch
failed, 503 when the device is dead. A batch not back within `batch_timeout_s` on a GPU (on the CPU it is
logged: a slow model, not a hung device), or a sticky device error, on any device, declares the service's
device dead (`on_dead`; fail fast, the supervisor restarts the process rather than the batcher limping on the
other devices): queued requests are answered 503, and the slot of a batch that never came back is never reused
(the device may still write its pinned memory).

Tracing (app/ops/tracing.py): with it on, `enqueue` and `_run_batch` are their traced variants,
chosen once here: each request's span context is kept until its answer, and each batch gets a
span linked to those of its requests. Off, the request path is the plain one.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from app.batching.device_clock import DeviceClock
from app.batching.shares import PendingRequest, Share, answer, fail, stage_rows
from app.batching.slot_pool import Lease, SlotPool
from app.engines.base import Engine
from app.errors import DeadlineExceededError, EngineError, NotReadyError, QueueFullError
from app.ops import metrics, tracing
from app.ops.metric_buffers import BufferedHistogram, BufferedSum, BufferedValue

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 0.5
# Refusals look through the queue for requests answered while queued at most this often: under a
# sustained overload every request is refused, and each look is O(queue).
PURGE_INTERVAL_S = 0.01


class Batcher:
    def __init__(
        self,
        engines: Engine | Sequence[Engine],  # one engine, or one per device: same model, same buckets
        *,
        max_delay_s: float,
        queue_limit: int,
        request_timeout_s: float,
        batch_timeout_s: float = 30.0,
        model: str = "",
        version: str = "1",
        on_dead: Callable[[str], None] = lambda reason: None,
        just_in_time: bool = False,
        fastest_bucket: bool = False,
    ) -> None:
        self.engines: tuple[Engine, ...] = tuple(engines) if isinstance(engines, Sequence) else (engines,)
        engine = self.engines[0]
        if any(other.buckets != engine.buckets for other in self.engines):
            raise ValueError(f"every device's engine needs the same buckets; got {[e.buckets for e in self.engines]}")
        self.max_delay_s = max_delay_s
        self.queue_limit = queue_limit
        self.request_timeout_s = request_timeout_s
        self.pool = SlotPool(self.engines)  # the slots of every device, and each device's load
        self.just_in_time = just_in_time
        self.fastest_bucket = fastest_bucket
        self.clock = DeviceClock(len(self.engines))  # when each device should be done, from measured batches
        self.batch_timeout_s = batch_timeout_s
        self._overdue: set[asyncio.Task[None]] = set()  # cpu batches past batch_timeout_s: logged as the first is
        self.dead: str | None = None  # why the device is dead, once it is
        self.dead_device: str | None = None  # which one
        self._on_dead = on_dead
        self.rows_per_s = 0.0  # moving average of rows answered per second of device time, for Retry-After
        self.buckets = tuple(engine.buckets)
        self.max_bucket = engine.buckets[-1]
        # pad_to[rows] = smallest bucket ≥ rows, for 1 ≤ rows ≤ max_bucket (the padding table).
        buckets = self.buckets
        self.pad_to = [0] + [buckets[bisect.bisect_left(buckets, rows)] for rows in range(1, self.max_bucket + 1)]
        self._queue: deque[PendingRequest] = deque()
        self._purged_at = 0.0  # time.monotonic() of the last look for requests answered while queued
        self._queued_rows = 0
        self._wakeup = asyncio.Event()
        self._num_classes = engine.slots[0].outputs.shape[1]
        self._batches: dict[asyncio.Task[None], tuple[float, Lease, list[Share]]] = {}  # task → (launched, …)
        self._loop_task: asyncio.Task[None] | None = None
        self._reaper_task: asyncio.Task[None] | None = None
        # The labelled metric children, looked up once rather than per batch, and buffered: plain
        # numbers until the next flush (app/ops/metric_buffers.py), not a lock and three calls each.
        self._bucket_metrics = {
            b: (
                BufferedSum(metrics.BATCHES.labels(model=model, bucket=str(b))),
                BufferedSum(metrics.PADDING_ROWS.labels(model=model, bucket=str(b))),
                BufferedHistogram(metrics.BATCH_COMPUTE.labels(model=model, bucket=str(b))),
            )
            for b in engine.buckets
        }
        self._queue_depth = BufferedValue(metrics.QUEUE_DEPTH.labels(model=model, version=version))
        self._queue_wait = BufferedHistogram(metrics.QUEUE_WAIT.labels(model=model))
        self._batch_rows = BufferedHistogram(metrics.BATCH_ROWS.labels(model=model))
        self._batch_wall = BufferedHistogram(metrics.BATCH_WALL.labels(model=model))
        self._in_flight = BufferedSum(metrics.IN_FLIGHT.labels(model=model))
        # Per device, by SlotPool index: (batches, rows, in flight).
        self._device_metrics = [metrics.device_children(model, engine.device) for engine in self.engines]
        self.model = model
        if tracing.active():
            self._links: dict[asyncio.Future[np.ndarray], Any] = {}  # a request's future → its span context
            self.enqueue = self._traced_enqueue  # type: ignore[method-assign]
            self._run_batch = self._traced_run_batch  # type: ignore[method-assign, assignment]

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def admit(self, deadline: float) -> None:
        """Refuse, before its body is read, a request that cannot be served in time: the device is
        dead, the queue is at its limit, or the queue ahead would outlast the request's deadline."""
        if self.dead is not None:
            raise NotReadyError(f"the device is dead ({self.dead}); the service is restarting")
        wait = self.drain_estimate_s()
        if self._queued_rows >= self.queue_limit or (wait and time.monotonic() + wait > deadline):
            self._drop_answered()  # a backlog of clients that left is no reason to refuse
            wait = self.drain_estimate_s()
            if self._queued_rows >= self.queue_limit:
                raise QueueFullError(self._queued_rows, self.queue_limit, retry_after_s=wait)
            if wait and time.monotonic() + wait > deadline:
                raise QueueFullError(self._queued_rows, self.queue_limit, retry_after_s=wait, deadline_first=True)

    def _drop_answered(self, *, every: float = PURGE_INTERVAL_S) -> None:
        """Take the requests answered while queued (their clients left, their deadlines passed) out of
        the queue and its count now, not when the collector next passes them: with every slot busy that
        may be a while. Runs where a request would otherwise be refused, and at each reap."""
        now = time.monotonic()  # not a caller's: the reaper may be handed a time ahead (tests)
        if now - self._purged_at < every:
            return
        self._purged_at = now
        if not any(request.future.done() for request in self._queue):
            return
        waiting: deque[PendingRequest] = deque()
        for request in self._queue:
            if request.future.done():
                self._queued_rows -= request.rows - request.next_row  # its unlaunched rows
            else:
                waiting.append(request)
        self._queue = waiting

    def device_figures(self) -> dict[str, dict[str, Any]]:
        """Device → batches launched and in flight on it."""
        pool = self.pool
        figures: dict[str, dict[str, Any]] = {engine.device: {} for engine in self.engines}
        for device, launched in pool.by_device(pool.launched).items():
            figures[device]["batches_launched"] = launched
        for device, in_flight in pool.by_device(pool.batches_in_flight).items():
            figures[device]["batches_in_flight"] = in_flight
        return figures

    def count_batches(self, rows: np.ndarray, buckets: np.ndarray, seconds: np.ndarray) -> None:
        """Batches of this batcher's engine launched outside it (the front door's launcher, app/front_door/launch.c)
        into its metrics: (m,) rows, buckets and device seconds each."""
        for bucket in np.unique(buckets).tolist():
            which = buckets == bucket
            batches, padding, compute = self._bucket_metrics[bucket]
            batches.inc(int(which.sum()))
            padding.inc(int((bucket - rows[which]).sum()))
            compute.observe_many(seconds[which].astype(np.float64))
        self._batch_rows.observe_many(rows)
        device_batches, device_rows, _ = self._device_metrics[0]
        device_batches.inc(len(rows))
        device_rows.inc(int(rows.sum()))
        self._measured(float(rows.sum()), float(seconds.sum()))  # the device's rate, for Retry-After and admission

    def _measured(self, rows: float, seconds: float) -> None:
        """`rows` answered in `seconds` of device time: rows_per_s, smoothed over ~20 batches."""
        if seconds > 0:
            rate = rows / seconds * len(self.engines)  # the devices run side by side
            self.rows_per_s = rate if not self.rows_per_s else self.rows_per_s + 0.05 * (rate - self.rows_per_s)

    def drain_estimate_s(self) -> float:
        """Seconds the rows queued now would take at the recent device throughput (0 when unknown)."""
        return self._queued_rows / self.rows_per_s if self.rows_per_s else 0.0

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
        self._queue_depth.set(0)
        # In-flight batches finish, within the batch timeout: one that never comes back holds no
        # shutdown hostage (its requests were answered by the reaper or are answered now).
        batches = list(self._batches)
        if batches:
            _, pending = await asyncio.wait(batches, timeout=self.batch_timeout_s)
            for task in pending:
                task.cancel()

    async def submit(self, images: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """`enqueue` awaited, for tests and benches: (k, C, H, W) uint8 pixels or float32 intensities →
        (k, num_classes) probabilities, in order. `deadline` (time.monotonic()) ends the request's life; at
        most request_timeout_s from now."""
        return await self.enqueue(images, deadline)

    def enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        """The future of these images' answer (the data plane awaits it; app/http/inline.py and the front
        door answer from its callback). Cancelling it drops the rows not yet launched."""
        rows = len(images)
        if self.dead is not None:
            raise NotReadyError(f"the device is dead ({self.dead}); the service is restarting")
        if self._queued_rows + rows > self.queue_limit:
            self._drop_answered()
            if self._queued_rows + rows > self.queue_limit:
                raise QueueFullError(self._queued_rows, self.queue_limit, retry_after_s=self.drain_estimate_s())
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        latest = now + self.request_timeout_s
        request = PendingRequest(
            images=images,
            probabilities=np.empty((rows, self._num_classes), dtype=np.float32),
            future=loop.create_future(),
            enqueued=now,
            deadline=latest if deadline is None else min(deadline, latest),
        )
        was_empty = not self._queue
        self._queue.append(request)
        self._queued_rows += rows  # the depth gauge is set per batch and per reap, not per request
        # Wake the collector only when its decision can change: the delay clock starts, or a
        # full batch is ready. Anything else it notices when its timer fires.
        if was_empty or self._queued_rows >= self.max_bucket:
            self._wakeup.set()
        return request.future

    def _traced_enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        """`enqueue`, keeping the request span's context (the caller's) until the request is answered."""
        future = Batcher.enqueue(self, images, deadline)
        ids = tracing.current()
        if ids is not None:
            self._links[future] = ids
            future.add_done_callback(self._links.pop)
        return future

    async def _traced_run_batch(self, lease: Lease, shares: list[Share], rows: int, launched: float) -> None:
        """`_run_batch` inside a batch span linked to each of its requests' spans."""
        links = [ids for ids in (self._links.get(request.future) for request, _, _ in shares) if ids is not None]
        queued_since = min(request.enqueued for request, _, _ in shares)
        span = tracing.start_batch(
            links, model=self.model, rows=rows, bucket=lease.rows, device=lease.engine.device, queued_since=queued_since
        )
        try:
            await Batcher._run_batch(self, lease, shares, rows, launched, span)
        finally:
            span.end()

    async def _collect_and_launch(self) -> None:
        while True:
            await self.pool.wait_free()
            await self._wait_for_batch()
            shares, rows = self._take_batch(self._batch_limit())
            if rows == 0:  # everything queued was cancelled or expired
                continue
            # The slot is chosen now, with the batch formed: the least-loaded device at launch.
            # From here it belongs to the batch's task, which alone gives it back.
            lease = self.pool.take(self.pad_to[rows])
            now = time.monotonic()
            self.clock.launched(lease.device, lease.rows, now)
            task = asyncio.create_task(self._run_batch(lease, shares, rows, now))
            self._batches[task] = (now, lease, shares)
            task.add_done_callback(self._batches.pop)

    async def _wait_for_batch(self) -> None:
        while self._queued_rows < self.max_bucket:
            if self._queue:
                if self.pool.idle():  # a device has nothing to do: waiting only adds latency
                    return
                launch_at = self._queue[0].enqueued + self.max_delay_s
                if self.just_in_time:  # every device busy: the batch would wait there anyway
                    device_free = self.clock.launch_at(self.pool.free_devices())
                    # At most the longest batch's time longer: an estimate gone wrong costs that, once.
                    launch_at = max(launch_at, min(device_free, launch_at + self.clock.longest_s()))
                remaining = launch_at - time.monotonic()
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

    def launch_moment(self) -> float:
        """When (time.monotonic()) a device is expected free, less staging: where every device is busy, the
        just-in-time moment to launch the next batch (app/front_door/feeder.py takes its rows then). With no
        slot free either, the soonest of every device: the next batch waits for a slot, then for that."""
        return self.clock.launch_at(self.pool.free_devices() or list(range(len(self.engines))))

    def _batch_limit(self) -> int:
        """The most rows the next batch takes: the largest bucket, unless every device is busy and a
        smaller full bucket computes more of the queued rows a device second than the one that
        pads them all (module docstring). Nothing measured yet: the largest bucket. A request whose
        rows cross the limit is split, its rest leading the next batch."""
        if not self.fastest_bucket or self._queued_rows >= 2 * self.max_bucket or self.pool.idle():
            return self.max_bucket  # (twice: a full batch unless most of those rows' clients left)
        # The rows of clients that left still count until something drops them: here they would make a
        # larger bucket look full. At most 2 × max_bucket rows' requests to look through.
        self._drop_answered(every=0.0)
        queued = self._queued_rows
        if queued >= self.max_bucket:
            return self.max_bucket
        best, best_rate = self.max_bucket, 0.0
        for bucket in self.buckets:
            if bucket > self.pad_to[queued]:  # padding every queued row already: larger only pads more
                break
            seconds = self.clock.estimate_s(bucket)
            if seconds <= 0:
                return self.max_bucket
            rate = min(queued, bucket) / seconds  # rows of this queue a device second
            if rate >= best_rate:  # a tie goes to the larger bucket: fewer rows left waiting
                best, best_rate = bucket, rate
        return best

    async def _reap_forever(self) -> None:
        """Every request gets an answer even when the collector cannot run (no free slot) or a
        launched batch never comes back (a hung device). Off the per-request path: one sweep a
        REAP_INTERVAL_S rather than a timer per request."""
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            self.reap(time.monotonic())

    def reap(self, now: float) -> None:
        for request in self._queue:
            if now >= request.deadline and not request.future.done():
                request.future.set_exception(DeadlineExceededError(request.deadline - request.enqueued))
        self._drop_answered(every=0.0)  # those, and the requests whose clients left
        self._queue_depth.set(self._queued_rows)  # a queue that no batch drains (no free slot) shows too
        self._overdue.intersection_update(self._batches)  # those still running
        for task, (launched, lease, shares) in list(self._batches.items()):
            # A launched batch's requests past their deadlines get 504 now, not once it is back: every protocol's,
            # the front door's too (its feeder has no timer of its own). Their rows are in the slot already.
            for request, _, _ in shares:
                if now >= request.deadline and not request.future.done():
                    request.future.set_exception(DeadlineExceededError(request.deadline - request.enqueued))
            if now - launched > self.batch_timeout_s:
                device = lease.engine.device
                timeout = f"the batch timeout of {self.batch_timeout_s:g} s"
                if device == "cpu":  # a slow or stuck model's code, not a hung device: logged, not fatal
                    if not self._overdue:  # once while any is overdue (those queued behind it are too)
                        log.warning("a batch of %d rows on the cpu has run past %s: the model is slow or stuck; its "
                                    "requests get 504 at their deadlines, the model's next batches wait for it",
                                    sum(end - start for _, start, end in shares), timeout)  # fmt: skip
                    self._overdue.add(task)
                    continue
                self.declare_dead(f"a batch on {device} did not complete within {timeout}", device)
                fail(shares, lambda: NotReadyError(f"the device is dead ({self.dead})"))

    def declare_dead(self, reason: str, device: str) -> None:
        """A device will not recover: answer everything queued 503 and tell the service (once)."""
        if self.dead is not None:
            return
        self.dead, self.dead_device = reason, device
        log.critical("%s; failing its requests", reason)
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(NotReadyError(f"the device is dead ({reason})"))
        self._queued_rows = 0
        self._queue_depth.set(0)
        self._on_dead(reason)

    def _take_batch(self, limit: int) -> tuple[list[Share], int]:
        """Pop up to `limit` rows off the queue, oldest first; answer expired requests 504."""
        shares: list[Share] = []
        rows = 0
        now = time.monotonic()
        while self._queue and rows < limit:
            request = self._queue[0]
            if request.future.done():  # the client went away or its own timeout fired
                self._queue.popleft()
                self._queued_rows -= request.rows - request.next_row
                continue
            if now >= request.deadline:  # its unlaunched rows (all, or the rest of a split) are dropped
                self._queue.popleft()
                self._queued_rows -= request.rows - request.next_row
                request.future.set_exception(DeadlineExceededError(request.deadline - request.enqueued))
                continue
            if request.next_row == 0:
                self._queue_wait.observe(now - request.enqueued)
            take = min(request.rows - request.next_row, limit - rows)
            shares.append((request, request.next_row, request.next_row + take))
            request.next_row += take
            rows += take
            self._queued_rows -= take
            if request.next_row == request.rows:
                self._queue.popleft()
        self._queue_depth.set(self._queued_rows)
        return shares, rows

    async def _run_batch(self, lease: Lease, shares: list[Share], rows: int, launched: float, span: Any = None) -> None:
        """Stage, replay and hand back one batch (`launched`: the collector's time.monotonic() as it took the
        slot); `span` (tracing on) gets an event at each step's end."""
        engine, slot, bucket = lease.engine, lease.slot, lease.rows
        batches, padding, compute = self._bucket_metrics[bucket]
        device_batches, device_rows, device_in_flight = self._device_metrics[lease.device]
        batches.inc()
        padding.inc(bucket - rows)
        self._batch_rows.observe(rows)
        device_batches.inc()
        device_rows.inc(rows)
        self._in_flight.inc()
        device_in_flight.inc()
        finished = False  # the device (and the staging thread) is done with the slot's memory
        seconds: float | None = None
        try:
            staging = time.monotonic()
            dtype = await stage_rows(shares, slot)
            self.clock.staged(time.monotonic() - staging)
            if span is not None:
                span.add_event("staged")
            seconds = await engine.run(slot, bucket, dtype)
            finished = True
            if span is not None:
                span.add_event("replayed")
        except BaseException as error:
            # Whatever the model's code raised on the engine's thread fails its batch, not the server: sys.exit's
            # SystemExit, KeyboardInterrupt, GeneratorExit, a CancelledError of its own (signals reach the main
            # thread's handlers, never a batch). Only this task's own cancellation (the server stopping) goes on.
            current = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and current is not None and current.cancelling():
                raise
            finished = engine.healthy()  # a sticky device error: the slot may still be in use
            log.exception(
                "batch of %d rows (bucket %d) on %s failed; failing its requests", rows, bucket, engine.device
            )
            raised = f"{type(error).__name__}: {error}"
            what = raised if isinstance(error, Exception) else f"the model's code raised {raised} computing a batch"
            if span is not None:
                span.record_exception(error)
            fail(shares, lambda: EngineError(what))
            if not finished:
                self.declare_dead(f"the {engine.device} device reported {what}", engine.device)
        else:
            compute.observe(seconds)
            self._measured(rows, seconds)
            answer(shares, slot.outputs)
            if span is not None:
                span.add_event("handed back")
        finally:
            if finished:  # answered, or failed with the device well: its requests have their answers or errors
                self._batch_wall.observe(time.monotonic() - launched)
            # The batches still on this device (a task done, its entry not yet popped, is not).
            still_there = [
                other.rows
                for task, (_, other, _) in self._batches.items()
                if other.device == lease.device and other is not lease and not task.done()
            ]
            self.clock.finished(lease.device, bucket, seconds if finished else None, time.monotonic(), still_there)
            self._in_flight.dec()
            device_in_flight.dec()
            self.pool.give_back(lease, reusable=finished)  # a slot whose batch never came back is never reused
            if finished and self._queue:  # its device may be idle now: the collector decides
                self._wakeup.set()
