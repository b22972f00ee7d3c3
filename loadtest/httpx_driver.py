"""The checking driver: httpx (HTTP/1.1), `--client httpx`. A full, independent HTTP client to
hold the lean driver's figures against (loadtest/lean_driver.py); 4–8× its CPU per request
(bench/results/2026-11-30-cpu-loadgen-drivers.md).

Connections: `connections` httpx transports of one connection each (Limits(max_connections=1)),
lent by a LifoPool, and requests sent with the transport's `handle_async_request`. One shared
httpx pool of N connections scans all of them on every request: at 64 connections that tripled
the client's CPU per request. Requests are built once, before the run.
"""

from __future__ import annotations

import importlib.util
import sys

import httpx

from loadtest.connections import LifoPool, TransportFailure
from loadtest.payloads import Payloads

# httpcore runs `import sniffio` on every request to learn the async library. Where sniffio is
# not installed (recent anyio no longer needs it), each failed import walks sys.path: ~0.3 ms of
# CPU a request, a third of the client's cost. A None entry makes the failure immediate, and
# httpcore then assumes asyncio, which is what runs here.
if importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]


def transport_kind(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol"
    if isinstance(exc, httpx.NetworkError):
        return "network"
    return f"transport:{type(exc).__name__}"


class HttpxDriver:
    """POSTs the payloads' bodies to `base_url` over at most `connections` connections."""

    def __init__(self, base_url: str, payloads: Payloads, *, connections: int, timeout_s: float) -> None:
        url = httpx.URL(base_url + payloads.path)
        headers = {"content-type": payloads.content_type, "accept": "application/json", **dict(payloads.headers)}
        timeout = {"timeout": httpx.Timeout(timeout_s).as_dict()}  # connect, read, write, pool
        # Built once and sent again and again: httpx streams bytes bodies anew on each send.
        self.requests = [
            httpx.Request("POST", url, content=b, headers=headers, extensions=timeout) for b in payloads.bodies
        ]
        self.pool: LifoPool[httpx.AsyncHTTPTransport] = LifoPool(connections, self._open, timeout_s)

    @property
    def connection_waits(self) -> int:
        return self.pool.waits

    @property
    def stale_retries(self) -> int:
        return 0  # httpx checks an idle connection before reusing it, and retries nothing (retries=0)

    async def _open(self) -> httpx.AsyncHTTPTransport:
        # The transport connects on its first request (and reconnects by itself when the server
        # closed an idle connection): nothing to await here.
        return httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=None),
            http1=True,
            http2=False,
            verify=False,  # plain http to this machine: skip loading CA certificates
            retries=0,
        )

    async def send(self, j: int) -> tuple[int, bytes]:
        transport = await self.pool.take()
        try:
            resp = await transport.handle_async_request(self.requests[j])
            try:
                body = await resp.aread()
            finally:
                await resp.aclose()
        except httpx.HTTPError as exc:
            raise TransportFailure(transport_kind(exc), f"{type(exc).__name__}: {exc}") from None
        finally:
            self.pool.give_back(transport)  # httpx reconnects a broken one by itself
        return resp.status_code, body

    async def aclose(self) -> None:
        for transport in self.pool.opened:
            await transport.aclose()
