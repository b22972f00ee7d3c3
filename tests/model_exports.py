"""The seed CNN exported the ways users bring models: TorchScript, torch.export (.pt2) and ONNX.

Each function writes a model folder (model file + model.toml) under `root` and returns it, so a
test can assemble a repository of the formats it needs, at test time, from the shipped weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from models.cnn import CLASS_NAMES, WEIGHTS_PATH, load_model

EXAMPLE_BATCH = 2
LABELS = "labels = [" + ", ".join(f'"{name}"' for name in CLASS_NAMES) + "]"


def model_folder(root: Path, name: str, toml: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.toml").write_text(f"{toml.strip()}\ninput_shape = [1, 28, 28]\n{LABELS}\n")
    return folder


def _example() -> torch.Tensor:
    return torch.rand(EXAMPLE_BATCH, 1, 28, 28)


def torchscript(root: Path) -> Path:
    folder = model_folder(root, "seed-torchscript", 'format = "torchscript"\nfile = "model.pt"')
    torch.jit.trace(load_model(), _example()).save(str(folder / "model.pt"))
    return folder


def exported(root: Path) -> Path:
    folder = model_folder(root, "seed-exported", 'format = "exported"\nfile = "model.pt2"')
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(load_model(), (_example(),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(folder / "model.pt2"))
    return folder


def onnx(root: Path) -> Path:
    folder = model_folder(root, "seed-onnx", 'format = "onnx"\nfile = "model.onnx"')
    batch = torch.export.Dim("batch", min=1, max=4096)
    torch.onnx.export(
        load_model(),
        (_example(),),
        str(folder / "model.onnx"),
        input_names=["x"],
        output_names=["logits"],
        dynamic_shapes={"x": {0: batch}},
        dynamo=True,
        verbose=False,
    )
    return folder


def python_factory(root: Path) -> Path:
    """The seed CNN through a model.py in its own folder, as Triton's python backend keeps it."""
    toml = f'format = "python"\nfactory = "model:build"\nweights = "{WEIGHTS_PATH.name}"'
    folder = model_folder(root, "seed-python", toml)
    shutil.copy(WEIGHTS_PATH, folder / WEIGHTS_PATH.name)  # a model's files stay inside its folder
    (folder / "model.py").write_text("from models.cnn import FashionCNN\n\n\ndef build():\n    return FashionCNN()\n")
    return folder
