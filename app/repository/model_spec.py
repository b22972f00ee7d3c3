"""What the service knows about one served model: its name, input, labels and preprocessing.

Read from the model's model.toml (app/repository/); the codecs, the batcher's buffers and the
engines take shapes from here, so nothing below the router knows which CNN it serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.repository.model_config import ModelConfig, Preprocess


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str  # the folder's name: /v1/models/{name}
    folder: Path
    config: ModelConfig
    class_names: tuple[str, ...]

    @property
    def input_shape(self) -> tuple[int, int, int]:  # (C, H, W) of one image
        return self.config.input_shape

    @property
    def pixels(self) -> int:
        c, h, w = self.input_shape
        return c * h * w

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def preprocess(self) -> Preprocess:
        return self.config.preprocess

    def max_image_pixels(self, setting: int) -> int:
        """Uploads above this are refused before decoding: the setting, or (0) 16× the input's pixels, ≥ 1024²."""
        _, h, w = self.input_shape
        return setting or max(1024 * 1024, 16 * h * w)

    def path(self, relative: str) -> Path:
        return self.folder / relative
