"""The seed CNN for Fashion-MNIST and how to load its shipped weights.

conv(1→32, 3×3) → ReLU → maxpool 2 → conv(32→64, 3×3) → ReLU → maxpool 2 → linear(1600→10).
Normalisation is part of the module, so the server (and a captured CUDA graph) takes pixel
intensities in [0, 1] and nothing upstream has to know the data set's statistics.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

# Fashion-MNIST training-set pixel statistics (intensities scaled to [0, 1]).
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530

INPUT_SHAPE = (1, 28, 28)  # (C, H, W) of one image
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
# The shipped weights live in the default model repository, beside their model.toml.
WEIGHTS_PATH = Path(__file__).parent / "repository" / "fashion-cnn" / "fashion_cnn.pt"


class FashionCNN(nn.Module):
    mean: torch.Tensor  # () buffers, saved with the weights
    std: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(PIXEL_MEAN))
        self.register_buffer("std", torch.tensor(PIXEL_STD))
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3),  # (B, 32, 26, 26)
            nn.ReLU(),
            nn.MaxPool2d(2),  # (B, 32, 13, 13)
            nn.Conv2d(32, 64, kernel_size=3),  # (B, 64, 11, 11)
            nn.ReLU(),
            nn.MaxPool2d(2),  # (B, 64, 5, 5)
        )
        self.classifier = nn.Linear(64 * 5 * 5, len(CLASS_NAMES))  # 1600 → 10

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, 1, 28, 28) intensities in [0, 1] → logits (B, 10)
        x = (x - self.mean) / self.std
        x = self.features(x)
        return self.classifier(torch.flatten(x, 1))


def load_model(weights: Path | str = WEIGHTS_PATH, device: torch.device | str = "cpu") -> FashionCNN:
    """The model in eval mode with the shipped (or given) state dict, on `device`."""
    model = FashionCNN()
    state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    model.load_state_dict(state)
    return model.to(device).eval()
