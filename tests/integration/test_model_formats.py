"""A repository of the seed CNN in every format, served at once by the real server on the CPU.

Each format's answers over HTTP equal the native PyTorch model's on real Fashion-MNIST test
images (labels exactly, scores within 1e-4), through each body form; a torchvision ResNet-18 with
seeded weights equals torchvision's own eager output where torchvision imports (the H200 run).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from models.cnn import load_model
from models.fashion_mnist import load_test_sample
from tests import model_exports
from tests.integration.server_process import ROOT, running_server

FORMATS = {
    "seed-torchscript": ("torchscript", model_exports.torchscript),
    "seed-exported": ("exported", model_exports.exported),
    "seed-onnx": ("onnx", model_exports.onnx),
    "seed-python": ("python", model_exports.python_factory),
}
IMAGES = 16
SERVE = (sys.executable, "-m", "app.cli", "serve")  # this interpreter: the H200 has no make venv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("repository")
    for _, export in FORMATS.values():
        export(root)
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(log, command=SERVE, model_repository=str(root), device="cpu") as url:
        yield url


def native_scores(images: np.ndarray) -> np.ndarray:
    """(k, 28, 28) uint8 → (k, 10) probabilities from the seed CNN itself, in PyTorch."""
    with torch.inference_mode():
        logits = load_model()(torch.from_numpy(images.astype(np.float32) / 255).reshape(-1, 1, 28, 28))
    return torch.softmax(logits, dim=1).numpy()


def png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def scores_of(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array([p["scores"] for p in answer.json()["predictions"]])


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_answers_as_the_native_model_in_every_body_form(server: str, name: str) -> None:
    images, labels = load_test_sample()
    images, labels = images[:IMAGES], labels[:IMAGES]
    want = native_scores(images)
    url = f"{server}/v1/models/{name}/predict"
    forms = {
        "json": httpx.post(url, json={"instances": (images / 255).tolist()}),
        "raw uint8": httpx.post(url, content=images.tobytes(), headers={"content-type": "application/octet-stream"}),
    }
    for form, answer in forms.items():
        got = scores_of(answer)
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"{name}, {form}")
        assert got.argmax(axis=1).tolist() == want.argmax(axis=1).tolist()
        assert answer.json()["model"] == name
    upload = httpx.post(url, files={"file": ("x.png", png(images[0]), "image/png")})
    np.testing.assert_allclose(scores_of(upload)[0], want[0], atol=1e-4)
    assert (want.argmax(axis=1) == labels).mean() >= 0.8  # real images, a trained model


def test_the_repository_lists_every_model_with_its_format_and_engine(server: str) -> None:
    listing = httpx.get(f"{server}/v1/models").json()
    assert listing["default"] is None
    served = {card["name"]: card for card in listing["models"]}
    assert set(served) == set(FORMATS)
    for name, (fmt, _) in FORMATS.items():
        assert served[name]["format"] == fmt and served[name]["ready"] is True
        assert served[name]["engine"] == ("onnxruntime" if fmt == "onnx" else "eager")
    assert served["seed-onnx"]["providers"] == ["CPUExecutionProvider"]
    # With several models and no CGSERVE_DEFAULT_MODEL, /predict says which names to use.
    answer = httpx.post(f"{server}/predict", json={"instances": [[0.0] * 784]})
    assert answer.status_code == 404 and "seed-onnx" in answer.json()["error"]["message"]
    exposition = httpx.get(f"{server}/metrics").text
    for name in FORMATS:
        assert f'cgserve_model_ready{{model="{name}"}} 1.0' in exposition


def _torchvision_imports() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, timeout=120)
    return probe.returncode == 0


def test_torchvision_resnet18_equals_torchvision_eager_or_names_the_fix(tmp_path: Path) -> None:
    folder = tmp_path / "repository" / "resnet18"
    folder.mkdir(parents=True)
    (folder / "model.toml").write_text(
        'format = "torchvision"\narchitecture = "resnet18"\narguments = { num_classes = 10 }\n'
        'weights = "resnet18.pt"\ninput_shape = [3, 64, 64]\nlabels = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", '
        '"c7", "c8", "c9"]\n[preprocess]\nmean = [0.485, 0.456, 0.406]\nstd = [0.229, 0.224, 0.225]\n'
    )
    if not _torchvision_imports():  # CI: PyPI's torchvision does not import beside the CPU torch wheel
        (folder / "resnet18.pt").write_bytes(b"")
        env = {**os.environ, "CGSERVE_MODEL_REPOSITORY": str(folder.parent)}
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "torchvision cannot be imported" in result.stderr and "'.[torchvision]'" in result.stderr
        return
    import torchvision

    torch.manual_seed(1)
    reference = torchvision.models.resnet18(num_classes=10).eval()
    torch.save(reference.state_dict(), folder / "resnet18.pt")
    pixels = np.random.default_rng(0).integers(0, 256, (4, 3, 64, 64), dtype=np.uint8)
    with torch.inference_mode():
        x = torch.from_numpy(pixels).float() / 255
        x = (x - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(
            1, 3, 1, 1
        )
        want = torch.softmax(reference(x), dim=1).numpy()
    with running_server(
        tmp_path / "server.log", command=SERVE, model_repository=str(folder.parent), device="cpu"
    ) as url:
        answer = httpx.post(
            f"{url}/predict", content=pixels.tobytes(), headers={"content-type": "application/octet-stream"}
        )
        nhwc = httpx.post(
            f"{url}/predict?layout=nhwc",
            content=np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)).tobytes(),
            headers={"content-type": "application/octet-stream"},
        )
    np.testing.assert_allclose(scores_of(answer), want, atol=1e-4)
    np.testing.assert_allclose(scores_of(nhwc), want, atol=1e-4)
