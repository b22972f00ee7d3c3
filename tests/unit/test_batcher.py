"""The batcher without HTTP: fill, delay, padding, split, deadline, overload, errors, cancellation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from app.batching.batcher import PURGE_INTERVAL_S, Batcher
from app.engines.base import InputDtype, Slot
from app.errors import DeadlineExceededError, EngineError, NotReadyError, QueueFullError
from tests.unit.fake_engine import SHAPE, FakeEngine, expected, images

pytestmark = pytest.mark.anyio

# A delay no test waits out: where it matters, the test proves the batch left without it.
FOREVER = 60.0


@asynccontextmanager
async def running(engine: FakeEngine, **options: Any) -> AsyncIterator[Batcher]:
    settings: dict[str, Any] = {"max_delay_s": FOREVER, "queue_limit": 1024, "request_timeout_s": FOREVER}
    settings.update(options)
    batcher = Batcher(
        engine,
        max_delay_s=settings["max_delay_s"],
        queue_limit=int(settings["queue_limit"]),
        request_timeout_s=settings["request_timeout_s"],
        on_dead=settings.get("on_dead", lambda reason: None),
        just_in_time=settings.get("just_in_time", False),
        fastest_bucket=settings.get("fastest_bucket", False),
    )
    batcher.start()
    try:
        yield batcher
    finally:
        engine.gate.set()
        await batcher.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    """Return once `condition()` holds; fail after `timeout_s`. Polls each turn of the loop: the
    batcher's state changes only on it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {condition.__doc__ or condition}"
        await asyncio.sleep(0)


async def occupy(engine: FakeEngine, batcher: Batcher) -> asyncio.Task[np.ndarray]:
    """Hold the device: a one-image batch launched and not let finish until `engine.gate` is set."""
    engine.gate.clear()
    busy = asyncio.create_task(batcher.submit(images(1.0)))
    await engine.launched.wait()
    return busy


async def submit_all(batcher: Batcher, *requests: np.ndarray) -> list[np.ndarray]:
    return await asyncio.wait_for(asyncio.gather(*(batcher.submit(r) for r in requests)), timeout=10)


def test_padding_table_maps_rows_to_smallest_bucket_that_fits() -> None:
    batcher = Batcher(FakeEngine((1, 2, 4, 8)), max_delay_s=0, queue_limit=64, request_timeout_s=1)
    assert [batcher.pad_to[rows] for rows in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


async def test_full_largest_bucket_launches_without_waiting_for_the_delay() -> None:
    engine = FakeEngine()
    async with running(engine) as batcher:
        values = [float(v) for v in range(1, 9)]
        results = await submit_all(batcher, *(images(v) for v in values))
    assert [bucket for bucket, _ in engine.launches] == [8]
    for value, result in zip(values, results, strict=True):
        np.testing.assert_array_equal(result, expected(value))


async def test_partial_batch_launches_after_max_delay_padded_to_bucket() -> None:
    engine = FakeEngine()
    async with running(engine, max_delay_s=0.02) as batcher:
        results = await submit_all(batcher, images(1.0), images(2.0), images(3.0))
    assert [bucket for bucket, _ in engine.launches] == [4]  # 3 rows + 1 padding
    assert engine.launched_values()[0][:3] == [1.0, 2.0, 3.0]
    for value, result in zip([1.0, 2.0, 3.0], results, strict=True):
        np.testing.assert_array_equal(result, expected(value))


async def test_an_idle_device_takes_a_lone_request_at_once_a_busy_one_lets_the_queue_fill() -> None:
    engine = FakeEngine(in_flight=2)
    async with running(engine) as batcher:  # max_delay forever: only idleness launches a partial batch
        engine.gate.clear()
        first = asyncio.create_task(batcher.submit(images(1.0)))
        await asyncio.wait_for(engine.launched.wait(), timeout=10)  # at once, without company
        rest = [asyncio.create_task(batcher.submit(images(v))) for v in (2.0, 3.0, 4.0)]
        await until(lambda: batcher.queued_rows == 3)
        # Kept: that nothing launches while the device is busy is an absence, with no event to
        # await; 50 ms gives a wrong launch the time to happen.
        await asyncio.sleep(0.05)
        assert engine.launched_values() == [[1.0]]  # busy: the three wait, a slot free or not
        engine.gate.set()  # the batch completes, the device is idle: the three leave together
        results = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=10)
    assert [bucket for bucket, _ in engine.launches] == [1, 4]
    assert engine.launched_values()[1][:3] == [2.0, 3.0, 4.0]  # and one row of padding
    for value, result in zip((1.0, 2.0, 3.0, 4.0), results, strict=True):
        np.testing.assert_array_equal(result, expected(value))


async def test_request_larger_than_largest_bucket_is_split_and_reassembled_in_order() -> None:
    engine = FakeEngine()
    values = [float(v) for v in range(20)]
    async with running(engine, max_delay_s=0.0) as batcher:
        (result,) = await submit_all(batcher, images(*values))
    assert [bucket for bucket, _ in engine.launches] == [8, 8, 4]
    np.testing.assert_array_equal(result, expected(*values))


async def test_multi_image_requests_are_packed_row_by_row() -> None:
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0) as batcher:
        engine.gate.clear()
        first = asyncio.create_task(batcher.submit(images(0.5)))
        await engine.launched.wait()  # the device is busy with [0.5]; the next three queue up
        rest = [asyncio.create_task(batcher.submit(images(v, v, v))) for v in (1.0, 2.0, 3.0)]
        await asyncio.sleep(0)
        engine.gate.set()
        results = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=10)
    # 9 rows queued behind the first batch: one full bucket of 8, the 9th row in a batch of 1.
    assert [bucket for bucket, _ in engine.launches] == [1, 8, 1]
    assert engine.launched_values()[1] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0]
    for value, result in zip((1.0, 2.0, 3.0), results[1:], strict=True):
        np.testing.assert_array_equal(result, expected(value, value, value))


async def test_two_batches_in_flight_while_the_device_is_busy() -> None:
    engine = FakeEngine(in_flight=2)
    async with running(engine, max_delay_s=0.0) as batcher:
        engine.gate.clear()
        tasks = [asyncio.create_task(batcher.submit(images(1.0)))]
        await until(lambda: len(engine.launches) == 1)
        tasks.append(asyncio.create_task(batcher.submit(images(2.0))))
        await until(lambda: len(engine.launches) == 2)
        tasks.append(asyncio.create_task(batcher.submit(images(3.0))))
        await until(lambda: batcher.queued_rows == 1)
        # Neither launched batch has come back; the third request waits for a free slot.
        assert engine.launched_values() == [[1.0], [2.0]]
        engine.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    assert engine.launched_values() == [[1.0], [2.0], [3.0]]
    for value, result in zip((1.0, 2.0, 3.0), results, strict=True):
        np.testing.assert_array_equal(result, expected(value))


async def test_request_past_its_deadline_gets_504_and_is_not_launched() -> None:
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0, request_timeout_s=0.05) as batcher:
        engine.gate.clear()
        first = asyncio.create_task(batcher.submit(images(1.0)))
        await engine.launched.wait()
        late = asyncio.create_task(batcher.submit(images(2.0)))
        await asyncio.sleep(0.1)  # kept: time passing is the behaviour; the device stays busy past the deadline
        engine.gate.set()
        np.testing.assert_array_equal(await first, expected(1.0))
        with pytest.raises(DeadlineExceededError):
            await late
    assert engine.launched_values() == [[1.0]]


async def test_queue_over_its_limit_sheds_with_503() -> None:
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0, queue_limit=4) as batcher:
        busy = await occupy(engine, batcher)
        queued = asyncio.create_task(batcher.submit(images(2.0, 2.0, 2.0, 2.0)))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError) as refused:
            await batcher.submit(images(3.0))
        assert refused.value.headers["Retry-After"] == "1" and int(refused.value.headers["Retry-After-Ms"]) >= 1
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(busy, queued), timeout=10)


async def test_failed_batch_fails_only_its_own_requests_and_batcher_keeps_running() -> None:
    engine = FakeEngine(poison=-1.0, in_flight=1)
    async with running(engine, max_delay_s=0.0) as batcher:
        engine.gate.clear()
        first = asyncio.create_task(batcher.submit(images(-1.0)))
        await engine.launched.wait()
        second = asyncio.create_task(batcher.submit(images(5.0)))
        await asyncio.sleep(0)
        engine.gate.set()
        with pytest.raises(EngineError, match="poisoned batch"):
            await first
        np.testing.assert_array_equal(await second, expected(5.0))
        np.testing.assert_array_equal(await batcher.submit(images(6.0)), expected(6.0))


async def test_every_request_of_a_failed_batch_gets_the_error() -> None:
    engine = FakeEngine(poison=-1.0)
    async with running(engine, max_delay_s=0.01) as batcher:
        outcomes = await asyncio.gather(*(batcher.submit(images(v)) for v in (1.0, -1.0, 2.0)), return_exceptions=True)
    assert [type(o) for o in outcomes] == [EngineError] * 3


async def test_cancelled_request_is_not_launched_and_others_are_answered() -> None:
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0) as batcher:
        busy = await occupy(engine, batcher)
        gone = asyncio.create_task(batcher.submit(images(2.0)))
        kept = asyncio.create_task(batcher.submit(images(3.0)))
        await asyncio.sleep(0)
        gone.cancel()  # the client disconnected while queued
        engine.gate.set()
        results = await asyncio.wait_for(asyncio.gather(busy, kept), timeout=10)
    np.testing.assert_array_equal(results[1], expected(3.0))
    launched = [v for values in engine.launched_values() for v in values]
    assert 2.0 not in launched
    assert batcher.queued_rows == 0


async def test_stop_answers_queued_requests_503() -> None:
    engine = FakeEngine(in_flight=1)
    batcher = Batcher(engine, max_delay_s=FOREVER, queue_limit=64, request_timeout_s=FOREVER)
    batcher.start()
    waiting = asyncio.create_task(batcher.submit(images(1.0)))
    await asyncio.sleep(0)
    await batcher.stop()
    with pytest.raises(NotReadyError):
        await waiting


async def test_reaper_answers_requests_that_no_free_slot_would_ever_collect() -> None:
    engine = FakeEngine(in_flight=1, device="cuda:0")
    async with running(engine, max_delay_s=0.0, request_timeout_s=600.0) as batcher:
        engine.gate.clear()  # a hung device: the one slot never comes back
        hung = asyncio.create_task(batcher.submit(images(1.0)))  # its deadline past the batch timeout
        await engine.launched.wait()
        queued = asyncio.create_task(batcher.submit(images(2.0), deadline=time.monotonic() + 5.0))
        await asyncio.sleep(0)
        batcher.reap(time.monotonic() + 6.0)  # the queued request's deadline has passed
        with pytest.raises(DeadlineExceededError):
            await queued
        batcher.reap(time.monotonic() + batcher.batch_timeout_s + 1.0)  # and the launched batch's bound
        with pytest.raises(NotReadyError, match="did not complete"):
            await hung


async def test_pixels_stay_uint8_unless_a_float_request_shares_the_batch() -> None:
    engine = FakeEngine()
    pixels = np.full((1, *SHAPE), 51, dtype=np.uint8)  # 51 / 255 = 0.2
    async with running(engine) as batcher:
        only_pixels = await submit_all(batcher, *([pixels] * 8))
        mixed = await submit_all(batcher, *([pixels] * 4), *(images(0.5) for _ in range(4)))
    assert engine.dtypes == ["uint8", "float32"]
    assert engine.launched_values()[1] == pytest.approx([0.2] * 4 + [0.5] * 4)
    for result in [*only_pixels, *mixed[:4]]:
        np.testing.assert_allclose(result, expected(0.2), rtol=1e-6)


async def test_a_hung_batch_declares_the_device_dead_once_and_its_slot_is_never_reused() -> None:
    engine = FakeEngine(in_flight=2, device="cuda:0")
    deaths: list[str] = []
    async with running(engine, max_delay_s=0.0, request_timeout_s=600.0, on_dead=deaths.append) as batcher:
        engine.gate.clear()  # the device never answers
        hung = asyncio.create_task(batcher.submit(images(1.0)))
        await engine.launched.wait()
        batcher.reap(time.monotonic() + batcher.batch_timeout_s + 1.0)
        batcher.reap(time.monotonic() + batcher.batch_timeout_s + 2.0)
        with pytest.raises(NotReadyError, match="dead"):
            await hung
        assert len(deaths) == 1 and batcher.dead is not None
        with pytest.raises(NotReadyError, match="dead"):  # refused at once, before its body would be read
            batcher.admit(time.monotonic() + 1.0)
        with pytest.raises(NotReadyError, match="dead"):
            await batcher.submit(images(2.0))


async def test_a_cpu_batch_past_the_batch_timeout_is_a_slow_model_logged_not_a_dead_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On the CPU a batch that runs long is the model's code being slow (or stuck), not a hung device: the server
    stays up for every other model, and the batch's answer still comes when it ends."""
    engine = FakeEngine(in_flight=2)  # device "cpu"
    deaths: list[str] = []
    async with running(engine, max_delay_s=0.0, request_timeout_s=60.0, on_dead=deaths.append) as batcher:
        engine.gate.clear()  # the model computes for ever, for now
        slow = asyncio.create_task(batcher.submit(images(1.0)))
        await engine.launched.wait()
        with caplog.at_level("WARNING"):
            batcher.reap(time.monotonic() + batcher.batch_timeout_s + 1.0)
            batcher.reap(time.monotonic() + batcher.batch_timeout_s + 2.0)
        assert deaths == [] and batcher.dead is None
        overdue = [r for r in caplog.records if "slow or stuck" in r.getMessage()]
        assert len(overdue) == 1, "logged once, not each reap"
        engine.gate.set()
        np.testing.assert_allclose(await slow, expected(1.0), rtol=1e-6)
        np.testing.assert_allclose(await batcher.submit(images(2.0)), expected(2.0), rtol=1e-6)


async def test_a_launched_batchs_request_past_its_deadline_gets_504_then_not_when_the_batch_is_back() -> None:
    """The front door's requests have no timer of their own: a review found one in a stuck CPU batch answered only
    when the batch came back (or never), and a stop waiting for it."""
    engine = FakeEngine(in_flight=2)
    async with running(engine, max_delay_s=0.0, request_timeout_s=60.0) as batcher:
        engine.gate.clear()  # the batch runs on
        late = asyncio.create_task(batcher.submit(images(1.0), deadline=time.monotonic() + 0.5))
        await engine.launched.wait()
        batcher.reap(time.monotonic() + 1.0)  # past its deadline, the batch still out
        with pytest.raises(DeadlineExceededError):
            await asyncio.wait_for(late, 1.0)
        engine.gate.set()
        np.testing.assert_allclose(await batcher.submit(images(2.0)), expected(2.0), rtol=1e-6)


@pytest.mark.parametrize("raised", [GeneratorExit(), asyncio.CancelledError()])
async def test_a_model_raising_generator_exit_or_its_own_cancellation_keeps_its_slots(raised: BaseException) -> None:
    """Past `except (Exception, SystemExit, KeyboardInterrupt)` they left the slot unreusable: after in_flight such
    batches every request of the model waited for a slot and got 504, the model still ready."""

    class Raising(FakeEngine):
        async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
            if (slot.inputs[dtype][:bucket] == 9.0).any():
                raise raised
            return await super().run(slot, bucket, dtype)

    async with running(Raising(in_flight=2), max_delay_s=0.0) as batcher:
        for _ in range(3):  # more than in_flight
            with pytest.raises(EngineError, match=f"the model's code raised {type(raised).__name__}"):
                await batcher.submit(images(9.0))
        np.testing.assert_allclose(await asyncio.wait_for(batcher.submit(images(2.0)), 5), expected(2.0), rtol=1e-6)


@pytest.mark.parametrize("raised", [SystemExit(3), SystemExit(0), KeyboardInterrupt()])
async def test_a_model_that_calls_sys_exit_fails_its_batch_not_the_server(raised: BaseException) -> None:
    """sys.exit (or KeyboardInterrupt) from a model's forward reached asyncio as itself and stopped the server
    (exit status the model's, 0 included): now that batch's requests get 500 saying so, and the next batch serves."""

    class Exiting(FakeEngine):
        async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
            if (slot.inputs[dtype][:bucket] == 9.0).any():
                raise raised
            return await super().run(slot, bucket, dtype)

    async with running(Exiting(), max_delay_s=0.0) as batcher:
        with pytest.raises(EngineError, match=f"the model's code raised {type(raised).__name__}"):
            await batcher.submit(images(9.0))
        np.testing.assert_allclose(await batcher.submit(images(2.0)), expected(2.0), rtol=1e-6)
        assert batcher.dead is None


async def test_a_deadline_shorter_than_the_timeout_and_the_unlaunched_rows_of_a_split_request() -> None:
    engine = FakeEngine(buckets=(1, 2), in_flight=1)
    async with running(engine, max_delay_s=0.0, request_timeout_s=FOREVER) as batcher:
        busy = await occupy(engine, batcher)
        # 5 rows: 2 and 2 and 1 once the device frees; its deadline passes while it waits.
        split = asyncio.create_task(batcher.submit(images(*[2.0] * 5), deadline=time.monotonic() + 0.05))
        await asyncio.sleep(0.1)  # kept: time passing is the behaviour; the deadline passes while it queues
        engine.gate.set()
        with pytest.raises(DeadlineExceededError):
            await split
        await busy
        assert batcher.queued_rows == 0
    assert [values for values in engine.launched_values() if 2.0 in values] == []  # none of it launched


async def test_clients_that_leave_while_the_device_is_busy_leave_the_queue_at_once() -> None:
    """Their rows stop counting once admission would refuse for them, not only when the collector
    next passes them: a device busy for a while must not make the backlog of gone clients refuse
    new ones."""
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0, queue_limit=8) as batcher:
        busy = await occupy(engine, batcher)  # the only slot is taken: nothing collects meanwhile
        gone = [batcher.enqueue(images(*[2.0] * 4)) for _ in range(2)]  # the queue is full: 8 of 8 rows
        with pytest.raises(QueueFullError):
            batcher.enqueue(images(3.0))  # one row too many
        for future in gone:
            future.cancel()  # both clients disconnect
        await asyncio.sleep(PURGE_INTERVAL_S)  # the refusal above looked through the queue just now
        batcher.admit(time.monotonic() + 60)  # admitted while the device is still busy
        assert batcher.queued_rows == 0
        kept = batcher.enqueue(images(*[4.0] * 8))
        engine.gate.set()
        results = await asyncio.wait_for(asyncio.gather(busy, kept), timeout=10)
    np.testing.assert_array_equal(results[1], expected(*[4.0] * 8))
    assert batcher.queued_rows == 0
    assert 2.0 not in [v for values in engine.launched_values() for v in values]


async def test_the_reaper_takes_the_rows_of_clients_that_left_out_of_the_queue_figures() -> None:
    """What the engine process sends the workers for their admission (queued rows) and the depth gauge."""
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0) as batcher:
        busy = await occupy(engine, batcher)
        gone, kept = batcher.enqueue(images(2.0, 2.0)), batcher.enqueue(images(3.0))
        gone.cancel()
        batcher.reap(time.monotonic())
        assert batcher.queued_rows == 1
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(busy, kept), timeout=10)


async def test_admission_refuses_before_the_body_when_the_queue_cannot_serve_in_time() -> None:
    engine = FakeEngine(in_flight=1)
    async with running(engine, max_delay_s=0.0, queue_limit=4) as batcher:
        busy = await occupy(engine, batcher)
        queued = asyncio.create_task(batcher.submit(images(*[2.0] * 4)))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError, match="limit is 4"):
            batcher.admit(time.monotonic() + 60)
        batcher.rows_per_s = 2.0  # 4 rows ahead at 2 rows/s: 2 s of queue
        batcher.queue_limit = 100
        with pytest.raises(QueueFullError, match="deadline") as refused:
            batcher.admit(time.monotonic() + 1.0)
        assert refused.value.headers["Retry-After-Ms"] == "2000"
        batcher.admit(time.monotonic() + 5.0)  # time enough: admitted
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(busy, queued), timeout=10)


@pytest.mark.parametrize("just_in_time", [True, False])
async def test_a_partial_batch_for_a_busy_device_waits_until_it_is_about_to_be_free(just_in_time: bool) -> None:
    """Every batch reports 10 s of device time; one is held on the device (the gate) while three
    requests arrive. Just in time, they wait for the device's expected end and go together when the
    batch comes back early; under max_delay (0 here) the first goes alone into the second slot."""
    engine = FakeEngine((1, 2, 4, 8), seconds=10.0)
    async with running(engine, max_delay_s=0.0, just_in_time=just_in_time) as batcher:
        await submit_all(batcher, images(1))  # the clock learns: a batch takes 10 s
        engine.gate.clear()
        first = asyncio.ensure_future(batcher.submit(images(2)))
        await until(lambda: len(engine.launches) == 2)  # the device was idle: at once
        later = [asyncio.ensure_future(batcher.submit(images(3)))]
        if not just_in_time:
            await until(lambda: len(engine.launches) == 3)  # alone, into the second slot
        later += [asyncio.ensure_future(batcher.submit(images(v))) for v in (4, 5)]
        await asyncio.sleep(0.2)  # the collector's chances to launch, 0.2 s of a 10 s hold
        launched_while_busy = len(engine.launches) - 2
        engine.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *later), timeout=10)
    for value, answer in zip((2, 3, 4, 5), answers, strict=True):
        np.testing.assert_array_equal(answer, expected(value))
    if just_in_time:
        assert launched_while_busy == 0
        assert engine.launched_values()[2][:3] == [3, 4, 5]  # one batch, once the device was back
    else:
        assert launched_while_busy == 1 and engine.launched_values()[2] == [3]


async def test_a_held_batch_goes_by_the_devices_expected_end_even_if_the_device_is_late() -> None:
    """Batches report 0.3 s; one stays on the device for good. The next launches once the device
    should have been done, into the second slot, not never."""
    engine = FakeEngine((1, 2, 4, 8), seconds=0.3)
    async with running(engine, max_delay_s=0.0, just_in_time=True) as batcher:
        await submit_all(batcher, images(1))
        engine.gate.clear()
        stuck = asyncio.ensure_future(batcher.submit(images(2)))
        await until(lambda: len(engine.launches) == 2)
        began = time.monotonic()
        held = asyncio.ensure_future(batcher.submit(images(3)))
        await asyncio.sleep(0.1)
        assert len(engine.launches) == 2  # held: the device should be busy for ~0.2 s more
        await until(lambda: len(engine.launches) == 3, timeout_s=5)
        assert 0.15 <= time.monotonic() - began <= 2.0
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(stuck, held), timeout=10)


async def test_before_any_batch_is_measured_a_partial_batch_goes_after_max_delay() -> None:
    """Nothing measured yet: no expected end to wait for, so the old rule (max_delay, 0 here)."""
    engine = FakeEngine((1, 2, 4, 8), seconds=10.0)
    async with running(engine, max_delay_s=0.0, just_in_time=True) as batcher:
        engine.gate.clear()
        first = asyncio.ensure_future(batcher.submit(images(1)))
        await until(lambda: len(engine.launches) == 1)
        second = asyncio.ensure_future(batcher.submit(images(2)))
        await until(lambda: len(engine.launches) == 2)  # alone, at once, while the first is on the device
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), timeout=10)


@pytest.mark.parametrize(
    ("fastest_bucket", "seconds", "first_batch"),
    [
        (True, lambda bucket: 1.0 + bucket, [3, 4, 5, 6]),  # 4 a full bucket: 4 rows in 5 s beat 5 in 9
        (False, lambda bucket: 1.0 + bucket, [3, 4, 5, 6, 7]),  # all-queued: padded to 8
        (True, 1.0, [3, 4, 5, 6, 7]),  # a batch's time flat in its rows: padding all of them wins
    ],
)
async def test_a_busy_device_gets_the_bucket_that_computes_most_rows_a_second(
    fastest_bucket: bool, seconds: Any, first_batch: list[float]
) -> None:
    """Every bucket measured first; then five requests queue behind a held batch (0 s of delay).
    With a batch's device time growing with its rows, a full 4 goes and the fifth leads the next."""
    engine = FakeEngine((1, 2, 4, 8), seconds=seconds)
    async with running(engine, max_delay_s=0.0, fastest_bucket=fastest_bucket) as batcher:
        measured = await measure_every_bucket(engine, batcher)
        engine.gate.clear()
        busy = asyncio.ensure_future(batcher.submit(images(2)))  # held on the device
        await until(lambda: len(engine.launches) == measured + 1)
        queued = [batcher.enqueue(images(v)) for v in (3, 4, 5, 6, 7)]
        await until(lambda: len(engine.launches) == measured + 2)
        engine.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(busy, *queued), timeout=10)
    for value, answer in zip((3, 4, 5, 6, 7), answers[1:], strict=True):
        np.testing.assert_array_equal(answer, expected(value))
    launched = engine.launched_values()[measured + 1 :]
    assert launched[0][: len(first_batch)] == first_batch
    assert len(launched[0]) == (4 if len(first_batch) == 4 else 8)  # a full bucket, or 5 rows padded to 8
    assert [row for batch in launched[1:] for row in batch[:1]] == ([7] if len(first_batch) == 4 else [])


async def measure_every_bucket(engine: FakeEngine, batcher: Batcher) -> int:
    """A batch of each bucket, each taken whole by the idle device: the clock knows them all. The launches."""
    for bucket in engine.buckets:
        await asyncio.wait_for(asyncio.gather(*(batcher.enqueue(images(1)) for _ in range(bucket))), 10)
    assert [bucket for bucket, _ in engine.launches] == list(engine.buckets)
    return len(engine.launches)


async def test_an_idle_device_takes_every_queued_row_whatever_the_bucket_times() -> None:
    engine = FakeEngine((1, 2, 4, 8), seconds=lambda bucket: 1.0 + bucket)
    async with running(engine, max_delay_s=0.0, fastest_bucket=True) as batcher:
        measured = await measure_every_bucket(engine, batcher)  # busy, 5 rows would go as a full 4
        queued = [batcher.enqueue(images(v)) for v in (3, 4, 5, 6, 7)]  # nothing in flight
        await asyncio.wait_for(asyncio.gather(*queued), timeout=10)
    assert engine.launched_values()[measured][:5] == [3, 4, 5, 6, 7]


async def test_rows_whose_clients_left_do_not_make_a_larger_bucket_look_full() -> None:
    """Five live requests and three cancelled ones queue behind a held batch: counted, the eight would
    fill bucket 8; the five live ones go as a full 4 and the fifth leads the next batch."""
    engine = FakeEngine((1, 2, 4, 8), seconds=lambda bucket: 1.0 + bucket)
    async with running(engine, max_delay_s=0.0, fastest_bucket=True) as batcher:
        measured = await measure_every_bucket(engine, batcher)
        engine.gate.clear()
        busy = asyncio.ensure_future(batcher.submit(images(2)))
        await until(lambda: len(engine.launches) == measured + 1)
        live = [batcher.enqueue(images(v)) for v in (3, 4)]
        for left in [batcher.enqueue(images(9)) for _ in range(3)]:
            left.cancel()
        live += [batcher.enqueue(images(v)) for v in (5, 6, 7)]
        await until(lambda: len(engine.launches) == measured + 2)
        engine.gate.set()
        await asyncio.wait_for(asyncio.gather(busy, *live), timeout=10)
    assert engine.launched_values()[measured + 1] == [3, 4, 5, 6]
