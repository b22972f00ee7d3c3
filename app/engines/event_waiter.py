"""Hands CUDA completions back to asyncio from a thread, without blocking the event loop.

One daemon thread waits on each batch's `done` event in the order they are handed to it (a
later event that completes first waits behind an earlier one: a delay, never a wrong answer)
and resolves the batch's asyncio future through `call_soon_threadsafe`.
`Event.synchronize` releases the GIL while it waits: in the driver's sleep for events made
with `blocking=True`, spinning for the others. It waits on one event at a time and never on
the device or a whole stream. Used for CGSERVE_EVENT_WAIT=spin|block, and by `poll` for a
batch that outlasts its polling budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading

import torch

_Item = tuple[torch.cuda.Event, asyncio.AbstractEventLoop, asyncio.Future[None]]


class EventWaiter:
    def __init__(self, name: str = "cuda-event-waiter") -> None:
        self._items: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._wait_in_order, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    def completion(self, event: torch.cuda.Event) -> asyncio.Future[None]:
        """A future that completes (or fails with the CUDA error) once `event` has completed;
        RuntimeError once closed (no thread would ever resolve it)."""
        if self._closed:
            raise RuntimeError("the CUDA event waiter is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._items.put((event, loop, future))
        return future

    def close(self) -> None:
        self._closed = True
        self._items.put(None)
        self._thread.join(timeout=5)

    def _wait_in_order(self) -> None:
        while (item := self._items.get()) is not None:
            event, loop, future = item
            error: BaseException | None = None
            try:
                event.synchronize()
            except BaseException as caught:  # a CUDA error surfaces here, in this batch's future
                error = caught
            # RuntimeError: the loop has closed, so nobody waits for this batch any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, error)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
