"""FashionCNN: shapes, the shipped weights, and their accuracy on real Fashion-MNIST images."""

from __future__ import annotations

import json
import os

import pytest
import torch

from models.cnn import WEIGHTS_PATH, FashionCNN, load_model
from models.evaluate import evaluate
from models.fashion_mnist import DATA_DIR, DEBIAN_PACKAGE, load_split, load_test_sample

RECORD_PATH = WEIGHTS_PATH.with_suffix(".json")


@pytest.fixture(scope="module")
def model() -> FashionCNN:
    return load_model()


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_maps_images_to_ten_logits(batch: int) -> None:
    x = torch.rand(batch, 1, 28, 28)  # intensities in [0, 1]
    with torch.inference_mode():
        assert FashionCNN().eval()(x).shape == (batch, 10)


def test_shipped_weights_load(model: FashionCNN) -> None:
    assert not model.training
    assert model.classifier.weight.shape == (10, 64 * 5 * 5)


def test_accuracy_on_shipped_sample(model: FashionCNN) -> None:
    images, labels = load_test_sample()  # first 1000 test images: runs without the Debian package
    assert evaluate(model, images, labels) >= 85.0


def test_accuracy_matches_record_on_full_test_set(model: FashionCNN) -> None:
    try:
        images, labels = load_split("test")
    except FileNotFoundError:
        message = f"Fashion-MNIST not found in {DATA_DIR}: apt-get install {DEBIAN_PACKAGE}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    recorded = json.loads(RECORD_PATH.read_text())["test_accuracy"]
    assert len(labels) == 10_000
    assert evaluate(model, images, labels) == pytest.approx(recorded, abs=0.5)
