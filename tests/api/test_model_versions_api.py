"""Versions over HTTP: /v2/models/{name}/versions/{v}/… routes to that version, a call naming none gets
the newest ready one, and /v1/models/{name} lists them (the app through its ASGI lifespan, on the CPU)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from models.cnn import WEIGHTS_PATH
from tests.model_exports import LABELS

TOML = (
    f'format = "python"\nfactory = "models.cnn:FashionCNN"\nweights = "{WEIGHTS_PATH.name}"\n'
    f'input_shape = [1, 28, 28]\ninput_datatype = "UINT8"\n{LABELS}\nversion_policy = {{ all = {{}} }}\n'
)
INFER = {"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": [7] * 784}]}


def write_versions(folder: Path) -> None:
    """cnn/1 and cnn/2: the same weights, version 2's scores are sigmoids (they do not sum to 1)."""
    for version, postprocess in (("1", "softmax"), ("2", "sigmoid")):
        (folder / "cnn" / version).mkdir(parents=True)
        shutil.copy(WEIGHTS_PATH, folder / "cnn" / version)
        (folder / "cnn" / version / "model.toml").write_text(TOML + f'postprocess = "{postprocess}"\n')


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("versions")
    write_versions(folder)
    settings = Settings(model_repository=folder, device="cpu", buckets=(1, 2), max_delay_ms=0.0)
    with TestClient(create_app(settings)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


def scores(answer: dict) -> np.ndarray:  # type: ignore[type-arg]
    return np.array(answer["outputs"][0]["data"], dtype=np.float32)


@pytest.mark.parametrize(("path", "version"), [("/versions/1", "1"), ("/versions/2", "2"), ("", "2")])
def test_infer_goes_to_the_version_named_or_the_newest(client: TestClient, path: str, version: str) -> None:
    answer = client.post(f"/v2/models/cnn{path}/infer", json=INFER)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_version"] == version
    total = float(scores(answer.json()).sum())
    assert (abs(total - 1) < 1e-4) == (version == "1")  # softmax sums to 1, sigmoids do not


def test_an_unknown_version_is_404_naming_the_versions(client: TestClient) -> None:
    for path in ("/v2/models/cnn/versions/3/infer", "/v2/models/cnn/versions/3", "/v2/models/cnn/versions/x/ready"):
        answer = client.post(path, json=INFER) if path.endswith("infer") else client.get(path)
        assert answer.status_code == 404, path
        assert "no version" in answer.json()["error"] and "1, 2" in answer.json()["error"]


def test_metadata_and_the_model_card_list_the_versions(client: TestClient) -> None:
    assert client.get("/v2/models/cnn").json()["versions"] == ["1", "2"]
    assert client.get("/v2/models/cnn/versions/1/ready").status_code == 200
    card = client.get("/v1/models/cnn").json()
    assert card["version"] == "2" and card["versions"] == {"1": {"ready": True}, "2": {"ready": True}}
    assert [m["name"] for m in client.get("/v1/models").json()["models"]] == ["cnn"]
    assert client.get("/readyz").status_code == 200


def test_each_version_has_its_own_queue_depth_and_graph_pool_series(client: TestClient) -> None:
    """Per-batcher gauges are per version: with one series a model, one version's set overwrote the other's."""
    client.post("/v2/models/cnn/versions/1/infer", json=INFER)
    client.post("/v2/models/cnn/versions/2/infer", json=INFER)
    exposition = client.get("/metrics").text
    for version in ("1", "2"):
        assert f'cgserve_queue_depth_rows{{model="cnn",version="{version}"}}' in exposition
        assert f'cgserve_graph_pool_bytes{{model="cnn",version="{version}"}}' in exposition
