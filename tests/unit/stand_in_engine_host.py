"""The engine process's host code (EngineHost, WorkerConnection) on a real Unix socket, over a stand-in
service: for tests of what the host and the workers' links say to each other, without engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.engine_process.host import EngineHost, WorkerConnection
from app.repository.model_spec import ModelSpec


class StandInModel(SimpleNamespace):
    """A served model's stand-in, hashable by identity as ServedModel is (the host keys its ids by it)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def stand_in(spec: ModelSpec) -> StandInModel:
    """A served model of the engine process, as its table reads one."""
    return StandInModel(spec=spec, engines=[SimpleNamespace(name="eager", device="cpu")], batcher=None,
                        options=SimpleNamespace(devices=("cpu",)), retired=False)  # fmt: skip


@asynccontextmanager
async def serving_host(
    socket_path: str, versions: dict[str, dict[str, StandInModel]], *, repository: Path, jpeg_decoder: Any = None
) -> AsyncIterator[tuple[Any, EngineHost]]:
    """The stand-in service (its `versions`, its JPEG decoder) and its host, listening on `socket_path`."""

    async def started() -> None:
        pass

    settings = SimpleNamespace(queue_limit=100, model_control="none", model_repository=repository)
    service = SimpleNamespace(versions=versions, failure=None, wait_started=started, jpeg_decoder=jpeg_decoder,
                              settings=settings, on_install=[], default_name=None, default_decided=False)  # fmt: skip
    host = EngineHost(service)  # type: ignore[arg-type]

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await WorkerConnection(host, reader, writer).run()

    server = await asyncio.start_unix_server(connected, path=socket_path)
    try:
        yield service, host
    finally:
        server.close()
