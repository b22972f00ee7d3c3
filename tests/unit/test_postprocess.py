"""model.toml's postprocess: softmax (default), sigmoid or none, applied once by every engine.

A model that ends in its own softmax used to be served softmax(softmax(x)): 0.571 where the
model gives 0.987. With postprocess = "none" its own scores come back unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

from app.config import Settings
from app.engines.cpu_eager import CpuEagerEngine
from app.main import create_app
from app.repository.model_spec import ModelSpec
from models.cnn import load_model
from models.fashion_mnist import load_test_sample
from tests.seed_model import seed_spec


def with_postprocess(spec: ModelSpec, postprocess: str) -> ModelSpec:
    return dataclasses.replace(spec, config=spec.config.model_copy(update={"postprocess": postprocess}))


def ends_in_softmax() -> nn.Module:
    return nn.Sequential(load_model(), nn.Softmax(dim=1)).eval()


def served_scores(module: nn.Module, spec: ModelSpec, x: np.ndarray) -> np.ndarray:
    """(k, 1, 28, 28) float32 → (k, 10) what the CPU engine writes into its slot."""
    engine = CpuEagerEngine(module, spec, (len(x),))
    slot = engine.slots[0]
    slot.inputs["float32"][: len(x)] = x
    asyncio.run(engine.run(slot, len(x), "float32"))
    engine.close()
    return slot.outputs[: len(x)].copy()


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    pixels, _ = load_test_sample()
    return (pixels[:8].astype(np.float32) / 255).reshape(-1, 1, 28, 28)


def test_none_serves_the_models_own_scores(images: np.ndarray) -> None:
    module = ends_in_softmax()
    with torch.inference_mode():
        own = module(torch.from_numpy(images)).numpy()
    got = served_scores(module, with_postprocess(seed_spec(), "none"), images)
    np.testing.assert_allclose(got, own, rtol=1e-5, atol=1e-7)
    # The default would soften the model's own probabilities a second time.
    doubled = served_scores(module, seed_spec(), images)
    assert doubled.max() < own.max() - 0.1


@pytest.mark.parametrize(
    ("postprocess", "want"), [("softmax", lambda t: torch.softmax(t, 1)), ("sigmoid", torch.sigmoid)]
)
def test_softmax_and_sigmoid_apply_to_the_logits(images: np.ndarray, postprocess: str, want: object) -> None:
    module = load_model()
    with torch.inference_mode():
        expected = want(module(torch.from_numpy(images))).numpy()  # type: ignore[operator]
    got = served_scores(module, with_postprocess(seed_spec(), postprocess), images)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    if postprocess == "sigmoid":  # independent per class: rows do not sum to one
        assert not np.allclose(got.sum(axis=1), 1.0)


def test_an_unknown_postprocess_is_a_model_toml_error(tmp_path: Path) -> None:
    from app.repository.model_config import ModelConfigError, read_model_config

    (tmp_path / "model.toml").write_text(
        'format = "python"\nfactory = "models.cnn:FashionCNN"\ninput_shape = [1, 28, 28]\n'
        'labels = ["a", "b"]\npostprocess = "argmax"\n'
    )
    with pytest.raises(ModelConfigError, match="postprocess"):
        read_model_config(tmp_path / "model.toml")


@pytest.fixture(scope="module")
def softmax_model_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("repository") / "softmaxed"
    folder.mkdir()
    (folder / "model.py").write_text(
        "from torch import nn\nfrom models.cnn import load_model\n\n"
        "def build():\n    return nn.Sequential(load_model(), nn.Softmax(dim=1))\n"
    )
    labels = ", ".join(f'"c{i}"' for i in range(10))
    (folder / "model.toml").write_text(
        f'format = "python"\nfactory = "model:build"\ninput_shape = [1, 28, 28]\nlabels = [{labels}]\n'
        'postprocess = "none"\n'
    )
    settings = Settings(model_repository=folder.parent)
    with TestClient(create_app(settings)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


def test_the_api_answers_the_models_own_scores(softmax_model_client: TestClient, images: np.ndarray) -> None:
    answer = softmax_model_client.post("/predict", json={"instances": images.reshape(-1, 28, 28).tolist()})
    assert answer.status_code == 200, answer.text
    with torch.inference_mode():
        own = ends_in_softmax()(torch.from_numpy(images)).numpy()
    scores = np.array([p["scores"] for p in answer.json()["predictions"]])
    np.testing.assert_allclose(scores, own, rtol=1e-4, atol=1e-6)
    described = softmax_model_client.get("/v1/models/softmaxed").json()
    assert described["postprocess"] == "none"


def test_the_answers_say_what_the_scores_are(softmax_model_client: TestClient, images: np.ndarray) -> None:
    predict = softmax_model_client.post("/predict", json={"instances": images[:1].reshape(-1, 28, 28).tolist()})
    assert predict.json()["postprocess"] == "none"
    pixels = (images[:1] * 255).round().astype(np.uint8)
    v2 = {"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": pixels.ravel().tolist()}]}
    answer = softmax_model_client.post("/v2/models/softmaxed/infer", json=v2)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["parameters"]["postprocess"] == "none"
