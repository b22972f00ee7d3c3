"""A graceful drain on SIGTERM (and SIGINT), in one process and in each worker of several.

uvicorn answers the signal by no longer accepting connections at once. Behind a load balancer
or a Kubernetes Service that loses requests: they keep arriving until the endpoint is taken
out, which it is only once readiness fails. So the first signal only starts the drain —
readiness 503 while requests are still served for CGSERVE_DRAIN_SECONDS — and then hands the
signal to uvicorn, which stops accepting, finishes every request it has read (up to
CGSERVE_SHUTDOWN_TIMEOUT_S) and exits. A second signal goes to uvicorn at once: the drain ends early, and what
was read is still answered. Once uvicorn has the signal, a SIGINT is its own second Ctrl+C: it quits at once.

A worker of several (app/runtime/workers.py) does not time its own stop: the manager, which holds the
listening socket too, first stops the kernel queueing connections for every process at once, and
only then tells each worker STOP_SIGNAL. Its further SIGTERMs and SIGINTs (a terminal's Ctrl+C
reaches the manager and every worker) change nothing; its own timer stays as a fallback.

Once stopping, a connection is closed after an answer, never under a request (app/http/protocol.py,
DrainingHttpProtocol).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_SIGNAL = signal.SIGUSR2  # the manager to a worker: the listening socket is closed, stop now
MANAGED_ENV = "CGSERVE_DRAIN_MANAGED"  # set by the manager for its workers
MANAGER_GRACE_S = 5.0  # a managed worker stops by itself this long after its drain, had no word come


@contextmanager
def drain_on_signals(drain_seconds: float, begin_drain: Callable[[], None],
                     stop_accepting: Callable[[], None] | None = None) -> Iterator[None]:  # fmt: skip
    """While the server runs: the first signal drains, then passes on to uvicorn's own handler, which stops
    accepting; `stop_accepting` is called on the event loop at that moment, for the ports uvicorn does not own."""
    managed = MANAGED_ENV in os.environ
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only (an in-process test client runs elsewhere)
        return
    loop = asyncio.get_running_loop()
    uvicorn_handlers: dict[int, Any] = {sig: signal.getsignal(sig) for sig in SIGNALS}
    draining = stopped = False

    def pass_on(sig: int, frame: FrameType | None) -> None:
        nonlocal stopped
        handler = uvicorn_handlers[sig]
        if not stopped and stop_accepting is not None:
            loop.call_soon_threadsafe(stop_accepting)
        stopped = True
        if callable(handler):
            handler(sig, frame)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal draining
        if draining:
            if not managed:
                pass_on(sig, frame)  # a second signal: stop accepting now
            return
        draining = True
        log.info("%s: draining for %g s before the server stops accepting", signal.Signals(sig).name, drain_seconds)
        loop.call_soon_threadsafe(begin_drain)
        if drain_seconds == 0 and not managed:  # no drain to wait for: uvicorn's now, so that a second signal is
            pass_on(sig, frame)  # its own second one (a stop through the loop let one come first and be lost)
            return
        timer_s = drain_seconds + MANAGER_GRACE_S if managed else drain_seconds
        loop.call_soon_threadsafe(loop.call_later, timer_s, stop_unless_stopped, sig, frame)

    def stop_unless_stopped(sig: int, frame: FrameType | None) -> None:
        if not stopped:
            pass_on(sig, frame)

    def on_stop_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal draining
        if not draining:
            draining = True
            loop.call_soon_threadsafe(begin_drain)
        stop_unless_stopped(signal.SIGTERM, frame)  # as uvicorn's: it ends by re-raising SIGTERM

    handled = (*SIGNALS, STOP_SIGNAL) if managed else SIGNALS
    previous = {sig: signal.getsignal(sig) for sig in handled}
    for sig in SIGNALS:
        signal.signal(sig, on_signal)
    if managed:
        signal.signal(STOP_SIGNAL, on_stop_signal)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
