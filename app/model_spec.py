"""What the service needs to know about a model: its input, its labels and how to build it.

The HTTP codecs, the batcher's buffers and the engines read shapes from here, so serving
another CNN means adding a spec, not editing them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from models.cnn import CLASS_NAMES, INPUT_SHAPE, load_model


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    input_shape: tuple[int, int, int]  # (C, H, W) of one image, float32 intensities in [0, 1]
    class_names: tuple[str, ...]
    # Builds the module the engines serve: (B, C, H, W) → logits (B, num_classes), on the CPU.
    # Engines turn logits into probabilities with a softmax in fp32, whatever the compute dtype.
    build: Callable[[Path], nn.Module]

    @property
    def pixels(self) -> int:
        c, h, w = self.input_shape
        return c * h * w

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


FASHION_CNN = ModelSpec(name="fashion-cnn", input_shape=INPUT_SHAPE, class_names=CLASS_NAMES, build=load_model)
SPECS = {FASHION_CNN.name: FASHION_CNN}
