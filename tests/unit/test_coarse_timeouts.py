"""The coarse timer behind every per-request timeout: fires late by at most a tick, never early,
never after a cancel, and behaves as asyncio.timeout_at towards the task it bounds."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from app.ops import timers
from app.ops.timers import TICK_S, call_at, timeout_at, wheel

SLACK_S = 0.05  # a loaded test machine wakes its loop late


def test_a_timeout_fires_after_its_deadline_and_within_a_tick() -> None:
    async def main() -> float:
        deadline = time.monotonic() + 0.05
        with pytest.raises(TimeoutError):
            async with timeout_at(deadline):
                await asyncio.sleep(5)
        return time.monotonic() - deadline

    late = asyncio.run(main())
    assert 0 <= late < TICK_S + SLACK_S


def test_a_block_done_in_time_keeps_its_result_and_the_idle_wheel_stops_sweeping() -> None:
    async def main() -> tuple[int, bool, bool]:
        async with timeout_at(time.monotonic() + 5):
            await asyncio.sleep(0.001)
            value = 7
        armed_now = bool(wheel().slots)
        await asyncio.sleep(3 * TICK_S)
        return value, armed_now, wheel()._sweeping is None

    value, armed_now, stopped = asyncio.run(main())
    assert value == 7 and not armed_now and stopped


def test_a_cancellation_from_elsewhere_passes_through_as_it_is() -> None:
    async def main() -> None:
        async def bounded() -> None:
            async with timeout_at(time.monotonic() + 5):
                await asyncio.sleep(5)

        task = asyncio.create_task(bounded())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_deadline_already_past_fires_at_the_next_sweep() -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with timeout_at(time.monotonic() - 1):
                await asyncio.sleep(5)

    asyncio.run(asyncio.wait_for(main(), timeout=1))


def test_the_inner_of_two_timeouts_fires_alone() -> None:
    async def main() -> str:
        async with timeout_at(time.monotonic() + 5):
            try:
                async with timeout_at(time.monotonic() + 0.02):
                    await asyncio.sleep(5)
            except TimeoutError:
                await asyncio.sleep(0.05)  # the outer block is still alive and not cancelled
                return "inner fired"
        return "nothing fired"

    assert asyncio.run(main()) == "inner fired"


def test_a_cancelled_timeout_never_calls_back_even_when_already_due() -> None:
    async def main() -> list[str]:
        fired: list[str] = []
        kept = call_at(time.monotonic() + 0.02, lambda: fired.append("kept"))
        dropped = call_at(time.monotonic() + 0.02, lambda: fired.append("dropped"))
        dropped.cancel()
        await asyncio.sleep(0.02 + 3 * TICK_S)
        # A sweep hands what is due to the loop; a cancel() before it runs still wins.
        late = call_at(time.monotonic() - 1, lambda: fired.append("late"))
        late.cancel()
        late.fire()
        assert kept.done
        return fired

    assert asyncio.run(main()) == ["kept"]


def test_each_event_loop_has_its_own_wheel() -> None:
    async def mine() -> timers.Wheel:
        return wheel()

    first, second = asyncio.run(mine()), asyncio.run(mine())
    assert first is not second and first.loop.is_closed()


def test_timeouts_leave_no_reference_cycles_for_the_garbage_collector() -> None:
    """Each request arms three: a cycle each (the callback's owner holds its Armed) would be
    garbage only a collection frees, on every request."""

    async def main() -> None:
        for _ in range(50):
            async with timeout_at(time.monotonic() + 5):
                await asyncio.sleep(0)
            call_at(time.monotonic() + 5, lambda: None).cancel()
        with pytest.raises(TimeoutError):
            async with timeout_at(time.monotonic() + 0.01):
                await asyncio.sleep(5)

    async def baseline() -> None:  # the same loop's life without a timeout: asyncio's own garbage
        for _ in range(50):
            await asyncio.sleep(0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(5), 0.01)

    def cyclic_garbage(run: Callable[[], Coroutine[Any, Any, None]]) -> int:
        gc.collect()
        gc.disable()
        try:
            asyncio.run(run())
            return gc.collect()
        finally:
            gc.enable()

    cyclic_garbage(main)  # once first: a timer wheel an earlier test left on its closed loop is freed here
    found = cyclic_garbage(main) - cyclic_garbage(baseline)
    assert found < 50, f"{found} more objects in reference cycles"  # 50 rounds × 6 cyclic objects before the fix
