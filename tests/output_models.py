"""Test models with named outputs (model.toml's [[outputs]]), written into a temporary repository.

    embedder   one tensor, an embedding (B, 512), postprocess none
    detector   a dict: boxes (B, 5, 4) FP32, scores (B, 5) FP32, labels (B, 5) INT64 (fixed N = 5)
    tagger     a tuple: class scores (B, 3) under softmax, then an embedding (B, 8)

Each builds seeded weights, so the server's module and the test's own (`eager`) are the same model.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn

INPUT_SHAPE = (3, 16, 16)

MODEL_PY = """import torch
from torch import nn


class Trunk(nn.Module):  # (B, 3, 16, 16) → (B, 64) features
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 64)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 4)
        return torch.relu(self.fc(x.flatten(1)))


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.head = Trunk(), nn.Linear(64, 512)

    def forward(self, x):
        return self.head(self.trunk(x))  # (B, 512)


class Detector(nn.Module):  # a fixed N = 5 boxes an image, DETR-like
    def __init__(self):
        super().__init__()
        self.trunk, self.boxes, self.classes = Trunk(), nn.Linear(64, 5 * 4), nn.Linear(64, 5 * 7)

    def forward(self, x):
        features = self.trunk(x)
        boxes = torch.sigmoid(self.boxes(features)).view(-1, 5, 4) * 16  # (B, 5, 4) pixels
        scores, labels = self.classes(features).view(-1, 5, 7).softmax(-1).max(-1)  # (B, 5), (B, 5) int64
        return {"labels": labels, "boxes": boxes, "scores": scores}  # not model.toml's order: matched by name


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.logits, self.embedding = Trunk(), nn.Linear(64, 3), nn.Linear(64, 8)

    def forward(self, x):
        features = self.trunk(x)
        return self.logits(features), self.embedding(features)  # (B, 3) logits, (B, 8)


def build(kind):
    torch.manual_seed(0)
    return {"embedder": Embedder, "detector": Detector, "tagger": Tagger}[kind]().eval()


def embedder():
    return build("embedder")


def detector():
    return build("detector")


def tagger():
    return build("tagger")
"""

COMMON = 'format = "python"\ninput_shape = [3, 16, 16]\nbuckets = [1, 4]\n'
TOMLS = {
    "embedder": COMMON + 'factory = "model:embedder"\npostprocess = "none"\n'
    '[[outputs]]\nname = "embedding"\nshape = [512]\n',
    "detector": COMMON + 'factory = "model:detector"\n'
    '[[outputs]]\nname = "boxes"\nshape = [5, 4]\n'
    '[[outputs]]\nname = "scores"\ndatatype = "FP32"\n'
    '[[outputs]]\nname = "labels"\ndatatype = "INT64"\nshape = [5]\n',
    "tagger": COMMON + 'factory = "model:tagger"\nlabels = ["cat", "dog", "owl"]\n'
    '[[outputs]]\nname = "tags"\nclasses = true\n'
    '[[outputs]]\nname = "embedding"\n',
}


def write_repository(folder: Path, kinds: tuple[str, ...] = tuple(TOMLS)) -> Path:
    """DIR/<kind>/{model.py, model.toml} for each kind; returns DIR."""
    for kind in kinds:
        (folder / kind).mkdir(parents=True, exist_ok=True)
        (folder / kind / "model.py").write_text(MODEL_PY)
        (folder / kind / "model.toml").write_text(TOMLS[kind])
    return folder


def module(kind: str, folder: Path) -> nn.Module:
    """The test's own copy of a model, from the repository's model.py."""
    found = importlib.util.spec_from_file_location(f"output_models_{kind}", folder / kind / "model.py")
    assert found is not None and found.loader is not None
    loaded = importlib.util.module_from_spec(found)
    found.loader.exec_module(loaded)
    built: nn.Module = loaded.build(kind)
    return built


def eager(kind: str, folder: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """(k, 3, 16, 16) float32 intensities → each named output as the model gives it, run here (softmax on the
    tagger's class scores, as its postprocess)."""
    with torch.inference_mode():
        returned = module(kind, folder)(torch.from_numpy(x))
    if kind == "embedder":
        return {"embedding": returned.numpy()}
    if kind == "detector":
        return {name: tensor.numpy() for name, tensor in returned.items()}
    logits, embedding = returned
    return {"tags": torch.softmax(logits, dim=1).numpy(), "embedding": embedding.numpy()}


def images(count: int, seed: int = 0) -> np.ndarray:
    """(count, 3, 16, 16) uint8 pixels."""
    return np.random.default_rng(seed).integers(0, 256, (count, *INPUT_SHAPE), dtype=np.uint8)
