"""Large decodes that hold the GIL take turns (app/ops/off_loop.py's off_loop_in_turn): one at a time in a process,
so that a flood of large JSON bodies holds one body's Python objects at once, not one a pool thread."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.ops.off_loop import off_loop, off_loop_in_turn


class Overlap:
    """A decode that takes a while and notes how many ran at once."""

    def __init__(self) -> None:
        self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, seconds: float) -> float:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(seconds)
        with self.lock:
            self.running -= 1
        return seconds


async def most_at_once(decode: object, calls: int) -> int:
    work = Overlap()
    assert await asyncio.gather(*(decode(work, 0.05) for _ in range(calls))) == [0.05] * calls  # type: ignore[operator]
    return work.most


def test_large_decodes_in_turn_run_one_at_a_time_where_the_pool_runs_several() -> None:
    assert asyncio.run(most_at_once(off_loop_in_turn, 4)) == 1
    if (os.cpu_count() or 1) > 1:  # the pool's threads, for contrast (one thread a core, up to four)
        assert asyncio.run(most_at_once(off_loop, 4)) > 1


def test_each_event_loop_has_its_own_turn() -> None:
    """A turn held by a loop that has ended does not hold the next loop's decodes (a test's, or a restarted app's)."""
    assert asyncio.run(most_at_once(off_loop_in_turn, 2)) == 1
    assert asyncio.run(most_at_once(off_loop_in_turn, 2)) == 1


def test_a_turn_lasts_as_long_as_its_decode_whatever_its_caller_does() -> None:
    """A caller cancelled (its deadline passed, its client left) stops waiting; its thread decodes on. The next
    decode waited for the caller and ran beside that thread."""

    async def scenario() -> int:
        work = Overlap()
        first = asyncio.ensure_future(off_loop_in_turn(work, 0.3))
        await asyncio.sleep(0.05)  # the first is decoding
        first.cancel()
        assert await asyncio.gather(off_loop_in_turn(work, 0.05), off_loop_in_turn(work, 0.05)) == [0.05, 0.05]
        return work.most

    assert asyncio.run(scenario()) == 1


def test_a_decode_the_pool_cannot_take_gives_its_turn_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool shut down (the server stopping) refuses the work: the turn was kept, and every later decode waited."""
    from app.ops import off_loop as module

    async def scenario() -> float:
        stopped = ThreadPoolExecutor(1)
        stopped.shutdown()
        with monkeypatch.context() as patched:
            patched.setattr(module, "_pool", stopped)
            with pytest.raises(RuntimeError):
                await off_loop_in_turn(Overlap(), 0.01)
        return await asyncio.wait_for(off_loop_in_turn(Overlap(), 0.01), 5)

    assert asyncio.run(scenario()) == 0.01
