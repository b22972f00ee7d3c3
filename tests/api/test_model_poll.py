"""CGSERVE_MODEL_CONTROL=poll: a changed model.toml is loaded, a new folder loaded, a removed one unloaded
(the app through its lifespan on the CPU; one poll round called directly instead of waiting for it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.config import DEFAULT_REPOSITORY, Settings
from app.main import create_app

MODEL = "fashion-cnn"


@pytest.fixture
def polled(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    shutil.copytree(DEFAULT_REPOSITORY / MODEL, tmp_path / MODEL, ignore=shutil.ignore_patterns("*.json"))
    settings = Settings(
        model_repository=tmp_path, device="cpu", model_control="poll", model_poll_seconds=3600, request_timeout_s=0.5
    )
    with TestClient(create_app(settings)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        client.portal.call(client.app.state.control._poll_once_ready)  # type: ignore[attr-defined]
        yield client, tmp_path


def poll(client: TestClient) -> None:
    client.portal.call(client.app.state.control.poll_once)  # type: ignore[attr-defined]


def test_poll_applies_what_changed_in_the_repository(polled: tuple[TestClient, Path]) -> None:
    client, repository = polled
    poll(client)  # nothing changed: nothing reloaded
    assert client.get(f"/v1/models/{MODEL}").json()["batching"]["max_delay_ms"] == 1.0
    toml = repository / MODEL / "model.toml"
    toml.write_text("max_delay_ms = 7.0\n" + toml.read_text())
    shutil.copytree(repository / MODEL, repository / "second")
    poll(client)
    assert client.get(f"/v1/models/{MODEL}").json()["batching"]["max_delay_ms"] == 7.0
    assert client.get("/v1/models/second/ready").status_code == 200
    shutil.rmtree(repository / "second")
    poll(client)
    assert client.get("/v1/models/second").status_code == 404
    assert client.post(f"/v2/repository/models/{MODEL}/unload").status_code == 503  # poll: no explicit calls


def test_a_broken_model_toml_keeps_the_model_serving(polled: tuple[TestClient, Path]) -> None:
    client, repository = polled
    toml = repository / MODEL / "model.toml"
    toml.write_text(toml.read_text() + "batch_size = 8\n")
    poll(client)
    assert client.get(f"/v1/models/{MODEL}/ready").status_code == 200
    index = client.post("/v2/repository/index").json()
    assert [e["state"] for e in index] == ["READY"]
