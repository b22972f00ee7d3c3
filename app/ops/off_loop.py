"""Decoding that would stall the event loop runs on a small thread pool instead.

An image decode (Pillow releases the GIL while it inflates and resamples) or a large JSON body
(orjson and numpy over millions of numbers) can take tens to hundreds of milliseconds; on the
loop that is time no other request is read, batched or answered. The pool is bounded (its
threads), and so is what waits for it: bodies in flight are bounded by CGSERVE_MAX_INFLIGHT_BYTES.
Its threads run at a lower CPU priority (nice +10): where cores are short, the event loop that
serves every request comes first, and a flood of large uploads slows the uploads themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

# JSON bodies below this decode in well under a millisecond: the thread hop would cost more.
LARGE_JSON_BYTES = 256 * 1024
DECODE_NICENESS = 10


def _lower_priority() -> None:
    """Linux schedules threads one by one: this thread (not the process) yields to the loop."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted: run as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DECODE_NICENESS)


_pool = ThreadPoolExecutor(
    max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="decode", initializer=_lower_priority
)


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_pool, partial(fn, *args, **kwargs))


# Per event loop (tests run several): the turn of large JSON decodes, held one at a time.
_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def off_loop_in_turn(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """off_loop, one call at a time in this process: for decodes that hold the GIL throughout (orjson and numpy
    over a large JSON body, a gRPC message's typed contents). Two at once end no sooner, but each holds its body's
    Python objects, up to ~30× its text for nested lists: 16 bodies of 16 MiB at once took 1.9 GB and left the loop
    seconds between turns (a hostile-client review). Those waiting hold only their bytes, which the in-flight budget
    counts, and their deadlines run."""
    loop = asyncio.get_running_loop()
    turn = _turns.get(loop)
    if turn is None:
        turn = _turns[loop] = asyncio.Lock()
    await turn.acquire()
    try:
        decode = loop.run_in_executor(_pool, partial(fn, *args, **kwargs))
    except BaseException:  # not scheduled (the pool shut down): no thread will end the turn
        turn.release()
        raise
    # The turn ends when the thread does, not when its caller stops waiting (a deadline, a client gone): the thread
    # decodes on, holding its objects, and the next would decode beside it.
    decode.add_done_callback(partial(_end_turn, turn))
    return await asyncio.shield(decode)


def _end_turn(turn: asyncio.Lock, decode: asyncio.Future[Any]) -> None:
    turn.release()
    if not decode.cancelled():
        decode.exception()  # read: one whose caller left is not logged as never retrieved
