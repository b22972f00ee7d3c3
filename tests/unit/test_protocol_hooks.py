"""Each app hands the HTTP protocol its own limits and inline handler through the ASGI lifespan state:
two apps in one process do not share them, and nothing is set on the protocol's class."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from uvicorn.config import Config
from uvicorn.server import ServerState

from app.config import Settings
from app.http.protocol import HOOKS_KEY, GuardedHttpProtocol, ProtocolHooks
from app.main import create_app
from tests.unit.test_inline_protocol import Transport  # a connection's transport, recording what is written


def lifespan_state(settings: Settings) -> dict[str, Any]:
    """What the app's lifespan yields to the server, read through Starlette's TestClient."""
    with TestClient(create_app(settings)) as client:
        return dict(client.app_state)


@pytest.mark.anyio
async def test_a_connection_takes_its_apps_limits_not_the_classs() -> None:
    small = lifespan_state(Settings(max_header_bytes=2000, header_timeout_s=2.5))[HOOKS_KEY]
    large = lifespan_state(Settings(max_header_bytes=9000, header_timeout_s=7.0))[HOOKS_KEY]
    assert isinstance(small, ProtocolHooks) and (small.max_header_bytes, large.max_header_bytes) == (2000, 9000)
    config = Config(app=lambda scope, receive, send: None, http=GuardedHttpProtocol, log_level="warning")
    config.load()
    protocols = [
        GuardedHttpProtocol(config=config, server_state=ServerState(), app_state={HOOKS_KEY: hooks})
        for hooks in (small, large)
    ]
    assert [p.max_header_bytes for p in protocols] == [2000, 9000]
    assert [p.header_timeout_s for p in protocols] == [2.5, 7.0]
    assert GuardedHttpProtocol.max_header_bytes == 65536  # the class's default, untouched
    transport = Transport()
    protocols[0].connection_made(transport)  # type: ignore[arg-type]
    protocols[0].data_received(b"GET / HTTP/1.1\r\nhost: x\r\nx-long: " + b"a" * 2200 + b"\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 431")  # the small app's limit, whatever the class says
