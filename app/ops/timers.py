"""Timeouts that almost never fire, on one timer per event loop instead of one per request.

Every request of the hot path carried three: the header timeout, the body's pause timeout (both
app/http/protocol.py now; the second armed only while part of a body is still to come) and the
end-to-end deadline (app/dataplane.py's within). Each armed a
loop timer and cancelled it again, two of them through asyncio.timeout, which wraps that in more
Python: together 33,000-37,000 instructions a request more than this module
(bench/results/2026-12-01-cpu-instructions-per-request.md). They all guard against the rare
client or device that stalls, so they need not be exact: here they share a hashed timing wheel,
slots of TICK_S, swept by one loop timer that runs only while something is armed. Arming and
disarming are a set insert and a set discard; a timeout fires between 0 and TICK_S after its
deadline.

    call_at(deadline, callback) -> Armed        deadline in time.monotonic(); .cancel() disarms
    async with timeout_at(deadline): ...        TimeoutError past it, as asyncio.timeout_at
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from types import TracebackType

TICK_S = 0.01  # a timeout fires at most this late; the sweep runs at this period while any is armed


class Armed:
    """One armed timeout; cancel() disarms it, up to the moment its callback runs."""

    __slots__ = ("_callback", "_slot", "_wheel")

    def __init__(self, wheel: Wheel, slot: int, callback: Callable[[], object]) -> None:
        self._wheel, self._slot = wheel, slot
        # Dropped once fired or cancelled: the callback's owner usually holds this Armed, and a
        # cycle per request would leave the garbage collector to free them.
        self._callback: Callable[[], object] | None = callback

    @property
    def done(self) -> bool:
        """Fired or cancelled."""
        return self._callback is None

    def cancel(self) -> None:
        if self._callback is None:
            return
        self._callback = None
        slots = self._wheel.slots
        entries = slots.get(self._slot)
        if entries is not None:
            entries.discard(self)
            if not entries:  # an empty wheel stops its sweep
                del slots[self._slot]

    def fire(self) -> None:
        # Scheduled by the sweep; a cancel() in between (the request finished first) wins.
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


class Wheel:
    """The timeouts of one event loop, by slot: slot n holds those due in ((n-1)·TICK_S, n·TICK_S]."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.slots: dict[int, set[Armed]] = {}
        self._swept = math.floor(time.monotonic() / TICK_S)  # every slot up to this one has fired
        self._sweeping: asyncio.TimerHandle | None = None

    def call_at(self, deadline: float, callback: Callable[[], object]) -> Armed:
        if self._sweeping is None:  # idle until now: the slots up to the present have nothing to fire
            self._swept = max(self._swept, math.floor(time.monotonic() / TICK_S))
            self._sweeping = self.loop.call_later(TICK_S, self._sweep)
        slot = max(math.ceil(deadline / TICK_S), self._swept + 1)  # a deadline already past: the next sweep
        armed = Armed(self, slot, callback)
        entries = self.slots.get(slot)
        if entries is None:
            self.slots[slot] = entries = set()
        entries.add(armed)
        return armed

    def _sweep(self) -> None:
        now = math.floor(time.monotonic() / TICK_S)
        for slot in range(self._swept + 1, now + 1):
            for armed in self.slots.pop(slot, ()):
                self.loop.call_soon(armed.fire)  # one that raises reaches the loop's handler, alone
        self._swept = max(self._swept, now)
        self._sweeping = self.loop.call_later(TICK_S, self._sweep) if self.slots else None


_wheels: dict[asyncio.AbstractEventLoop, Wheel] = {}
_latest: Wheel | None = None  # the wheel last looked up: a server process has one loop, so nearly always its


def wheel() -> Wheel:
    """The running loop's wheel (made on first use; forgotten with its loop once that is closed)."""
    global _latest
    loop = asyncio.get_running_loop()
    found = _wheels.get(loop)
    if found is None:
        for old in [old for old in _wheels if old.is_closed()]:
            del _wheels[old]
        _wheels[loop] = found = Wheel(loop)
    _latest = found
    return found


def call_at(deadline: float, callback: Callable[[], object]) -> Armed:
    """`callback()` on the running loop once time.monotonic() passes `deadline` (up to TICK_S later)."""
    found = _latest
    if found is None or found.loop is not asyncio.get_running_loop():
        found = wheel()
    return found.call_at(deadline, callback)


class timeout_at:
    """asyncio.timeout_at on the wheel: the block's task is cancelled at the deadline and the block
    raises TimeoutError; a cancellation from elsewhere passes through as it is."""

    __slots__ = ("_armed", "_cancelling", "_deadline", "_expired", "_task")

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._expired = False

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout_at needs a task")
        self._task, self._cancelling = task, task.cancelling()
        self._armed = call_at(self._deadline, self._expire)

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._armed.cancel()
        # Ours if the task's cancellations are back to what they were when the block began.
        if self._expired and self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from error

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()
