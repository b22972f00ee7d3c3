"""What the drivers of a generator process share: the failure they raise and the pool that lends
their connections.

A driver (loadtest/lean_driver.py, loadtest/httpx_driver.py; loadtest/grpc_driver.py for gRPC) sends
body j of the payloads and returns (status, body); anything that is not an answer is a
`TransportFailure` whose kind names it the same way in every driver (connect, timeout, protocol,
network, pool_timeout; grpc_<STATUS> and grpc_stream_ended for gRPC).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class TransportFailure(Exception):
    """No HTTP answer: `kind` goes into the record's error counts, `message` into its examples."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class Driver(Protocol):
    @property
    def connection_waits(self) -> int:
        """Requests that found every connection busy."""
        ...

    @property
    def stale_retries(self) -> int:
        """Requests sent again because the server had closed their idle connection (lean only)."""
        ...

    async def send(self, j: int) -> tuple[int, bytes]:
        """Body j of the payloads, POSTed; (status, body) of the answer, or TransportFailure."""
        ...

    async def aclose(self) -> None: ...


class LifoPool(Generic[T]):
    """At most `limit` connections, lent last-in first-out so that few stay hot.

    The queue holds one slot per connection allowed: an open connection, or None for one not
    opened yet (or dropped after a failure), which `take` opens with `open_`. A request that finds
    the queue empty waits for a slot, at most `timeout_s` (TransportFailure pool_timeout).
    """

    def __init__(self, limit: int, open_: Callable[[], Awaitable[T]], timeout_s: float) -> None:
        if limit < 1:
            raise ValueError(f"a connection pool needs a limit ≥ 1, got {limit}")
        self.open_, self.timeout_s = open_, timeout_s
        self.slots: asyncio.LifoQueue[T | None] = asyncio.LifoQueue()
        for _ in range(limit):
            self.slots.put_nowait(None)
        self.opened: list[T] = []  # every connection ever opened, for closing at the end
        self.waits = 0

    async def take(self) -> T:
        if not self.slots.empty():
            conn = self.slots.get_nowait()
        else:
            self.waits += 1
            try:
                async with asyncio.timeout(self.timeout_s):
                    conn = await self.slots.get()
            except TimeoutError:
                message = f"no free connection within {self.timeout_s:g} s (--connections)"
                raise TransportFailure("pool_timeout", message) from None
        if conn is not None:
            return conn
        try:
            conn = await self.open_()
        except BaseException:
            self.slots.put_nowait(None)  # the slot stays free for the next request
            raise
        self.opened.append(conn)
        return conn

    def give_back(self, conn: T | None) -> None:
        """Return a connection to the pool, or None where it cannot be used again."""
        self.slots.put_nowait(conn)
