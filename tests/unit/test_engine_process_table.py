"""The table of served models that the engine process sends its workers (model control through the engine
process): the real EngineHost and WorkerConnection over a real Unix socket, a stand-in engine service,
and real workers' Services applying each table. Each case is one the review found failing."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app.config import DEFAULT_REPOSITORY, Settings
from app.engine_process.client import RemoteBatcher
from app.engine_process.host import EngineHost
from app.ops import metrics
from app.repository import read_repository
from app.repository.model_spec import ModelSpec
from app.service import Service
from tests.unit.stand_in_engine_host import serving_host, stand_in

MODEL = "fashion-cnn"


@asynccontextmanager
async def engine_process(tmp_path: Path) -> AsyncIterator[tuple[Path, ModelSpec, Any, EngineHost, str]]:
    repository = tmp_path / "repository"
    shutil.copytree(DEFAULT_REPOSITORY / MODEL, repository / MODEL, ignore=shutil.ignore_patterns("*.json"))
    spec = read_repository(repository)[0]
    socket_path = str(tmp_path / "engine.sock")
    async with serving_host(socket_path, {MODEL: {"1": stand_in(spec)}}, repository=repository) as (service, host):
        yield repository, spec, service, host, socket_path


def worker(tmp_path: Path, repository: Path, socket_path: str, name: str, fatal: list[int]) -> Service:
    (tmp_path / f"segments-{name}").mkdir()
    return Service(Settings(model_repository=repository, device="cpu"), on_fatal=lambda: fatal.append(1),
                   engine_process=(socket_path, str(tmp_path / f"segments-{name}")))  # fmt: skip


async def started_worker(tmp_path: Path, repository: Path, socket_path: str, name: str, fatal: list[int]) -> Service:
    """A worker (`worker`) started, once it serves the engine process's table."""
    serving = worker(tmp_path, repository, socket_path, name, fatal)
    serving.start()
    await serving.wait_started()
    return serving


def served_id(service: Service, version: str = "1") -> int:
    batcher = service.versions[MODEL][version].batcher
    assert isinstance(batcher, RemoteBatcher)
    return batcher.model_id


def test_a_model_whose_files_broke_after_it_was_built_is_served_by_every_worker_as_built(tmp_path: Path) -> None:
    """The workers take each version's spec from the table, as the engine process built it: a model.toml
    broken (or edited) since cannot kill them (it did: read from disk, its error looked like an unreadable
    answer) nor make them decode for another model than the one built."""

    async def scenario() -> None:
        async with engine_process(tmp_path) as (repository, _, service, host, socket_path):
            fatal: list[int] = []
            serving = await started_worker(tmp_path, repository, socket_path, "a", fatal)
            shutil.copytree(repository / MODEL, repository / "other")
            other = dataclasses.replace(read_repository(repository / "other")[0], name="other")
            (repository / "other" / "model.toml").write_text("this is = = not toml")  # broken since it was built
            service.versions["other"] = {"1": stand_in(other)}
            host.broadcast()
            await host.applied(timeout_s=5)
            assert serving.engine_link is not None and serving.engine_link.dead is None and not fatal
            assert serving.models["other"].spec.input_shape == other.input_shape  # the spec it was built from
            assert serving.models["other"].spec.class_names == other.class_names
            await serving.stop()

    asyncio.run(scenario())


def test_a_table_sent_while_a_worker_starts_is_the_one_it_serves(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path) as (repository, spec, service, host, socket_path):
            starting = worker(tmp_path, repository, socket_path, "b", [])
            starting.start()
            while not host.connections:  # noqa: ASYNC110 (the host has no event for a worker's HELLO)
                await asyncio.sleep(0.001)
            service.versions[MODEL] = {"1": stand_in(spec)}  # a reload: the same version, a new build, a new id
            host.broadcast()
            await host.applied(timeout_s=5)
            await starting.wait_started()
            assert served_id(starting) == max(host.by_id)  # the new build, not the first table's
            await starting.stop()

    asyncio.run(scenario())


def test_a_worker_that_leaves_does_not_hold_a_control_call(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with engine_process(tmp_path) as (repository, spec, service, host, socket_path):
            staying, leaving = (worker(tmp_path, repository, socket_path, name, []) for name in ("c1", "c2"))
            for each in (staying, leaving):
                each.start()
                await each.wait_started()

            async def never_applies(table: Any) -> None:
                await asyncio.sleep(100)

            assert leaving.engine_link is not None
            leaving.engine_link.on_models = never_applies
            service.versions[MODEL] = {"1": stand_in(spec)}
            host.broadcast()
            asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(leaving.engine_link.close()))  # type: ignore[union-attr]
            began = time.monotonic()
            await host.applied(timeout_s=10)
            assert time.monotonic() - began < 5  # the worker left after 0.2 s: not the 10 s timeout
            assert served_id(staying) == max(host.by_id)
            await staying.stop()

    asyncio.run(scenario())


def test_a_frame_of_another_shape_than_the_model_was_built_for_is_refused_alone(tmp_path: Path) -> None:
    """A worker whose files changed under it sends rows of another shape: its frame is refused with why,
    not staged into a batch it would fail for every worker's requests."""
    import numpy as np

    from app.engine_process.client import EngineLink
    from app.engine_process.frames import EngineProcessError

    async def scenario() -> None:
        async with engine_process(tmp_path) as (_, __, ___, ____, socket_path):
            (tmp_path / "segments").mkdir()
            link = EngineLink(socket_path, str(tmp_path / "segments"), on_dead=lambda why: None)
            await link.connect(timeout_s=5)
            model = int(link.table[MODEL]["1"]["id"])
            with pytest.raises(EngineProcessError, match=r"3×28×28 images for a model built for 1×28×28"):
                await link.send(model, np.zeros((1, 3, 28, 28), np.uint8), 1e9)
            await link.close()

    asyncio.run(scenario())


def test_a_spec_crosses_the_socket_whole(tmp_path: Path) -> None:
    """What a worker serves is what the engine process built: every field of the spec, the outputs its
    probe found included, survive the table's JSON."""
    from app.repository import load_model
    from tests.output_models import write_repository

    seed = read_repository(DEFAULT_REPOSITORY)[0]
    assert ModelSpec.from_wire(orjson_round_trip(seed.to_wire())) == seed
    detector = load_model(read_repository(write_repository(tmp_path, ("detector",)))[0]).spec
    assert detector.outputs is not None
    assert ModelSpec.from_wire(orjson_round_trip(detector.to_wire())) == detector


def orjson_round_trip(value: Any) -> Any:
    import orjson

    return orjson.loads(orjson.dumps(value))


def test_the_engine_process_gone_turns_off_every_models_readiness_not_a_model_named_engines(tmp_path: Path) -> None:
    """A worker whose link to the engine process died set cgserve_model_ready{model="engines"} to 0, a series of
    no model, and left its models' at 1."""

    async def scenario() -> None:
        async with engine_process(tmp_path) as (repository, _, _service, _host, socket_path):
            fatal: list[int] = []
            serving = await started_worker(tmp_path, repository, socket_path, "a", fatal)
            metrics.MODEL_READY.labels(model=MODEL).set(1)
            assert serving.engine_link is not None
            serving.engine_link.on_dead("its connection closed (ConnectionResetError)")  # as the link calls it
            assert fatal == [1] and serving.failure is not None and "the engine process" in serving.failure
            assert REGISTRY.get_sample_value("cgserve_model_ready", {"model": MODEL}) == 0
            assert REGISTRY.get_sample_value("cgserve_model_ready", {"model": "engines"}) is None
            await serving.stop()

    asyncio.run(scenario())
