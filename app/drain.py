"""A graceful drain on SIGTERM (and SIGINT), in one process and in each worker of several.

uvicorn answers the signal by no longer accepting connections at once. Behind a load balancer
or a Kubernetes Service that loses requests: they keep arriving until the endpoint is taken
out, which it is only once readiness fails. So the first signal only starts the drain —
readiness 503 while requests are still served for CGSERVE_DRAIN_SECONDS — and then hands the
signal to uvicorn, which stops accepting, finishes every request it has read (up to
CGSERVE_SHUTDOWN_TIMEOUT_S) and exits. A second signal goes to uvicorn at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def drain_on_signals(drain_seconds: float, begin_drain: Callable[[], None]) -> Iterator[None]:
    """While the server runs: the first signal drains, then passes on to uvicorn's own handler."""
    if threading.current_thread() is not threading.main_thread() or drain_seconds == 0:
        yield  # signals reach the main thread only (an in-process test client runs elsewhere)
        return
    loop = asyncio.get_running_loop()
    uvicorn_handlers: dict[int, Any] = {sig: signal.getsignal(sig) for sig in SIGNALS}
    draining = False

    def pass_on(sig: int, frame: FrameType | None) -> None:
        handler = uvicorn_handlers[sig]
        if callable(handler):
            handler(sig, frame)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal draining
        if draining:
            pass_on(sig, frame)
            return
        draining = True
        log.info("%s: draining for %g s before the server stops accepting", signal.Signals(sig).name, drain_seconds)
        loop.call_soon_threadsafe(begin_drain)
        loop.call_soon_threadsafe(loop.call_later, drain_seconds, pass_on, sig, frame)

    for sig in SIGNALS:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for number, handler in uvicorn_handlers.items():
            signal.signal(number, handler)
