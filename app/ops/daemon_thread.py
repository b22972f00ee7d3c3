"""Work a stopping process must not wait for: run on a daemon thread of its own, awaited through a future.

asyncio.to_thread's threads (the loop's default executor) are joined when the loop closes, and every
ThreadPoolExecutor's threads again at the interpreter's exit. A model's factory that reads weights from a slow
mount for a minute then holds a stopping process up for that minute, past the budget its supervisor gives it
(the engine process was SIGKILLed by its parent after its server's SIGTERM, a load under way: the lifecycle
review). A daemon thread is not waited for: the process ends with the work unfinished, which a stopping server
wants. Use it for work that holds nothing the process must release in order (files read, a model built on the
CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
_running: set[threading.Thread] = set()  # started here and not yet returned


async def in_daemon_thread(fn: Callable[..., T], /, *args: object, name: str = "daemon-work") -> T:
    """fn(*args) on a new daemon thread; its result or exception here. Cancelled, the caller stops waiting and the
    thread runs on, its result dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:  # on the loop
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as raised:  # handed to the caller, as to_thread does
            result, error = None, raised
        finally:
            _running.discard(threading.current_thread())
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    _running.add(thread)
    thread.start()
    return await future


@contextlib.contextmanager
def at_work() -> Iterator[None]:
    """The calling thread (a pool's: an engine's forward on the CPU) is at work a stopping process must not wait
    for while in the block: a model's code that never returns is left unfinished by leave_now_if_unfinished, where
    the interpreter's end would join its pool's thread for ever (run_in_executor's threads are not daemons)."""
    thread = threading.current_thread()
    _running.add(thread)
    try:
        yield
    finally:
        _running.discard(thread)


def leave_now_if_unfinished(log: logging.Logger, *, failed: bool = False, status: int = 0) -> None:
    """For a process that ends by returning from its main (the engine process), or a server's lifespan: where work
    started here is still going, say so and leave through os._exit, `status` (1 where `failed`, the exception being
    handled logged first). The
    interpreter's end would stop that thread where it stands, and one inside torch's C++ code aborts the process
    (SIGABRT, std::terminate: the review of this module's first use)."""
    if left := sorted(thread.name for thread in list(_running)):
        if failed:
            log.exception("stopping after a failure")
        log.warning("stopping with %s still at work: it is left unfinished", ", ".join(left))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else status)
