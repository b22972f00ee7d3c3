"""POST /predict's model without CGSERVE_DEFAULT_MODEL: the one model the server first served, kept for the
process's life. A review found it decided again at each request from the models served then: loading a second
model turned /predict into a 404, and unloading the first made it answer from the second, another model's labels,
with no error (app/service.py's decide_default). The app through its lifespan on the CPU."""

from __future__ import annotations

import shutil
from pathlib import Path

from fastapi.testclient import TestClient

from app.config import DEFAULT_REPOSITORY, Settings
from app.main import create_app
from app.service import Service
from tests.api.test_model_control_edges import MODEL, RAW

OTHER = "shirts"
IMAGE = bytes(784)


def repository_of(path: Path, *names: str) -> Path:
    for name in names:
        shutil.copytree(DEFAULT_REPOSITORY / MODEL, path / name, ignore=shutil.ignore_patterns("*.json"))
    return path


def wait_started(client: TestClient) -> None:
    service: Service = client.app.state.service  # type: ignore[attr-defined]
    client.portal.call(service.wait_started)


def test_predict_keeps_the_first_model_served_as_others_come_and_go(tmp_path: Path) -> None:
    repository = repository_of(tmp_path / "repository", MODEL)
    settings = Settings(model_repository=repository, device="cpu", model_control="explicit")
    with TestClient(create_app(settings)) as client:
        wait_started(client)
        assert client.post("/predict", content=IMAGE, headers=RAW).json()["model"] == MODEL
        repository_of(repository, OTHER)
        assert client.post(f"/v2/repository/models/{OTHER}/load").status_code == 200
        answer = client.post("/predict", content=IMAGE, headers=RAW)
        assert answer.status_code == 200 and answer.json()["model"] == MODEL  # was 404: "several models"
        assert client.get("/v1/models").json()["default"] == MODEL
        assert client.post(f"/v2/repository/models/{MODEL}/unload").status_code == 200
        answer = client.post("/predict", content=IMAGE, headers=RAW)
        assert answer.status_code == 404, answer.json()  # was 200 from shirts
        error = answer.json()["error"]
        assert f"no model named '{MODEL}'" in error["message"] and OTHER in error["expected"]
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        assert client.post("/predict", content=IMAGE, headers=RAW).json()["model"] == MODEL


def test_a_server_that_first_served_several_models_has_no_default_after_an_unload(tmp_path: Path) -> None:
    repository = repository_of(tmp_path / "repository", MODEL, OTHER)
    settings = Settings(model_repository=repository, device="cpu", model_control="explicit")
    with TestClient(create_app(settings)) as client:
        wait_started(client)
        refused = client.post("/predict", content=IMAGE, headers=RAW)
        assert refused.status_code == 404 and "no default model" in refused.json()["error"]["message"]
        assert "CGSERVE_DEFAULT_MODEL" in refused.json()["error"]["expected"]
        assert client.post(f"/v2/repository/models/{OTHER}/unload").status_code == 200
        refused = client.post("/predict", content=IMAGE, headers=RAW)
        assert refused.status_code == 404  # was 200 from MODEL
        assert "no default model" in refused.json()["error"]["message"]
        assert client.get("/v1/models").json()["default"] is None
