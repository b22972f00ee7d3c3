"""app/front_door's Python parts without a server: the bulk answers are encode_predictions' bytes for any
model, a bulk's latencies land in the buckets one observe each would, a missing compiler is a clear error,
and the service is not ready before the door is open."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from app.codecs.bodies import encode_predictions
from app.config import DEFAULT_REPOSITORY, Settings
from app.front_door import library
from app.front_door.answers import Answers
from app.ops.metric_buffers import BufferedHistogram
from app.repository import load_model, read_repository
from app.repository.model_spec import ModelSpec
from app.service import Service
from tests.output_models import write_repository
from tests.seed_model import seed_spec


def specs(folder: Path) -> list[ModelSpec]:
    """The seed CNN (class scores) and every model of named outputs tests/output_models.py writes."""
    return [seed_spec(), *(load_model(spec).spec for spec in read_repository(write_repository(folder)))]


def test_bulk_answers_are_encode_predictions_bytes(tmp_path: Path) -> None:
    for spec in specs(tmp_path):
        check_bulk_answers(spec)


def check_bulk_answers(spec: ModelSpec) -> None:
    width = len(spec.class_names) if spec.layout.default else spec.layout.width
    scores = np.random.default_rng(0).random((5, width), dtype=np.float32)
    mine = Answers(spec, "cuda-graph")(scores)
    theirs = [encode_predictions(scores[i : i + 1], model=spec.name, engine="cuda-graph", spec=spec) for i in range(5)]
    assert mine == theirs


def test_observe_many_equals_one_observe_each() -> None:
    values = np.array([0.001, 0.0049, 0.005, 0.0, -1.0, 0.5, 1.0, 7.5, 0.01, 123.0])
    one, many = CollectorRegistry(), CollectorRegistry()
    direct = Histogram("h", "h", buckets=(0.001, 0.005, 0.01, 0.1, 1.0), registry=one)
    buffered = BufferedHistogram(Histogram("h", "h", buckets=(0.001, 0.005, 0.01, 0.1, 1.0), registry=many))
    for value in values.tolist():
        direct.observe(value)
    buffered.observe_many(values)
    buffered.flush()

    def text(registry: CollectorRegistry) -> str:
        return "\n".join(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)

    assert text(many) == text(one)


def test_no_compiler_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("PATH", str(tmp_path))  # and no cc on it
    with pytest.raises(library.BuildError, match=r"no C compiler .* set front_door_library"):
        library.door_library(None)
    with pytest.raises(library.BuildError, match="is not a file"):
        library.door_library(tmp_path / "missing.so")


def test_readiness_waits_for_what_starts_with_the_models() -> None:
    """The front door opens after the models are ready (it needs the default model's shape): until it is open
    the service is not ready, or a client told "ready" would find its port closed."""

    async def scenario() -> None:
        service = Service(Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0))
        opening, opened = asyncio.Event(), asyncio.Event()

        async def slow_to_open() -> None:
            opening.set()
            await opened.wait()

        service.on_started.append(slow_to_open)
        service.start()
        await opening.wait()
        ready, detail = service.readiness()
        assert not ready and "front door" in detail
        opened.set()
        await service.wait_started()
        assert service.readiness() == (True, "ready")
        await service.stop()

    interval = sys.getswitchinterval()  # a started service sets its process's
    try:
        asyncio.run(scenario())
    finally:
        sys.setswitchinterval(interval)
