"""Accuracy of FashionCNN weights on the Fashion-MNIST test set.

python -m models.evaluate [--weights models/repository/fashion-cnn/fashion_cnn.pt]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.cnn import CLASS_NAMES, WEIGHTS_PATH, load_model
from models.fashion_mnist import load_split

BATCH_SIZE = 1000  # large batches: evaluation is throughput-bound, and 1000×784 floats is ~3 MB


def to_input(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, 28, 28) → float32 (N, 1, 28, 28) in [0, 1], the model's input."""
    return torch.from_numpy(images).unsqueeze(1).float().div_(255.0)


@torch.inference_mode()
def predict(model: nn.Module, images: np.ndarray, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """Predicted class per image: uint8 (N, 28, 28) → int64 (N,)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    preds = [
        model(to_input(images[i : i + batch_size]).to(device)).argmax(1).cpu()
        for i in range(0, len(images), batch_size)
    ]
    model.train(was_training)
    return torch.cat(preds).numpy()


def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in percent of `model` on uint8 images (N, 28, 28) with int64 labels (N,)."""
    return float((predict(model, images) == labels).mean() * 100.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--weights", type=Path, default=WEIGHTS_PATH, help="state dict to evaluate")
    args = parser.parse_args()

    model = load_model(args.weights)
    images, labels = load_split("test")
    preds = predict(model, images)
    correct = preds == labels
    print(f"{args.weights}: test accuracy {correct.mean() * 100:.2f}% on {len(labels)} images")
    for k, name in enumerate(CLASS_NAMES):
        print(f"  {k} {name:<12} {correct[labels == k].mean() * 100:6.2f}%")


if __name__ == "__main__":
    main()
