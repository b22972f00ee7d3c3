"""FashionCNN with its shipped weights: what it computes, how it loads, how well it classifies."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.cnn import CLASS_NAMES, WEIGHTS_PATH, FashionCNN, load_model
from models.evaluate import evaluate, to_input
from models.fashion_mnist import DATA_DIR, DEBIAN_PACKAGE, load_split, load_test_sample

RECORD_PATH = WEIGHTS_PATH.with_suffix(".json")
EXAMPLES = Path(__file__).resolve().parents[2] / "models" / "examples"


@pytest.fixture(scope="module")
def model() -> FashionCNN:
    return load_model()


@pytest.fixture(scope="module")
def sample() -> tuple[torch.Tensor, np.ndarray]:
    """The first 64 shipped test images as the model's input (64, 1, 28, 28) in [0, 1], and their labels (64,)."""
    images, labels = load_test_sample()
    return to_input(images[:64]), labels[:64]


@torch.inference_mode()
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_maps_a_batch_of_images_to_ten_logits_each(model: FashionCNN, batch: int) -> None:
    logits = model(torch.rand(batch, 1, 28, 28))  # intensities in [0, 1]
    assert logits.shape == (batch, len(CLASS_NAMES)) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@torch.inference_mode()
def test_each_row_is_independent_of_the_rest_of_the_batch(
    model: FashionCNN, sample: tuple[torch.Tensor, np.ndarray]
) -> None:
    # What batching requests together relies on: a row's answer is the one it gets alone,
    # whatever shares its batch and in whatever order (padding rows included).
    x, _ = sample  # (64, 1, 28, 28)
    batched = model(x)  # (64, 10)
    alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    padded = torch.cat([x[order], torch.zeros(8, 1, 28, 28)])
    torch.testing.assert_close(model(padded)[: len(x)], batched[order], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_the_same_input_gives_the_same_logits(model: FashionCNN, sample: tuple[torch.Tensor, np.ndarray]) -> None:
    x, _ = sample
    assert torch.equal(model(x), model(x))
    assert torch.equal(load_model()(x), model(x))  # and a second load of the shipped file


def example_inputs() -> dict[str, torch.Tensor]:
    """models/examples' one image in its three request forms, each as the model's input (1, 1, 28, 28)."""
    instances = json.loads((EXAMPLES / "ankle-boot.json").read_text())["instances"]
    png = np.array(Image.open(EXAMPLES / "ankle-boot.png").convert("L"))
    raw = np.frombuffer(bytearray((EXAMPLES / "ankle-boot.u8").read_bytes()), dtype=np.uint8).reshape(-1, 28, 28)
    return {
        "json": torch.tensor(instances, dtype=torch.float32).reshape(-1, 1, 28, 28),
        "png": to_input(png[None]),
        "u8": to_input(raw),
    }


@torch.inference_mode()
@pytest.mark.parametrize("form", ["json", "png", "u8"])
def test_shipped_weights_classify_the_shipped_example(model: FashionCNN, form: str) -> None:
    # The example is the first Fashion-MNIST test image, labelled "Ankle boot".
    images, labels = load_test_sample()
    assert CLASS_NAMES[labels[0]] == "Ankle boot"
    x = example_inputs()[form]
    torch.testing.assert_close(x, to_input(images[:1]), atol=1 / 255, rtol=0)
    probabilities = model(x).softmax(1)  # (1, 10)
    assert CLASS_NAMES[int(probabilities.argmax())] == "Ankle boot"
    assert probabilities[0, labels[0]] > 0.99


class RunsCodeWhenUnpickled:
    """What a malicious weights file carries: unpickling it calls os.mkdir(path)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.path),)


def test_loading_runs_no_code_from_the_weights_file(tmp_path: Path) -> None:
    # load_model reads with weights_only=True: tensors and plain containers, never arbitrary objects.
    weights, marker = tmp_path / "evil.pt", tmp_path / "code-ran"
    torch.save({**FashionCNN().state_dict(), "payload": RunsCodeWhenUnpickled(marker)}, weights)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_model(weights)
    assert not marker.exists()


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
