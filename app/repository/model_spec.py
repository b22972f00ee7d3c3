"""What the service knows about one served model: its name, input, labels and preprocessing.

Read from the model's model.toml (app/repository/); the codecs, the batcher's buffers and the
engines take shapes from here, so nothing below the router knows which CNN it serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.repository.model_config import ModelConfig, Preprocess
from app.repository.outputs import OutputLayout


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str  # the folder's name: /v1/models/{name}
    folder: Path  # the version's files: DIR/<name>/<version>/, or DIR/<name>/ for an unversioned model
    config: ModelConfig
    class_names: tuple[str, ...]
    version: str = "1"  # /v2/models/{name}/versions/{version}; an unversioned model's is "1"
    config_file: Path | None = None  # its model.toml where not in `folder` (DIR/<name>/model.toml)
    # Its outputs as the probe found them (app/repository/__init__.py's load_model); None before the probe,
    # where a model without [[outputs]] has its one class-scores output (`layout`).
    outputs: OutputLayout | None = None

    @property
    def layout(self) -> OutputLayout:
        """What the model returns per image and how a packed (B, width) float32 row is cut into it."""
        return self.outputs if self.outputs is not None else OutputLayout.scores(len(self.class_names))

    @property
    def toml(self) -> Path:
        """The model.toml this version was read from: what a problem names."""
        return self.config_file or self.folder / "model.toml"

    @property
    def home(self) -> Path:
        """The model's folder, which every file it names must lie inside."""
        return self.toml.parent if self.config_file is not None else self.folder

    @property
    def folders(self) -> tuple[Path, ...]:
        """Where the files model.toml names are looked for: the version's folder, then the model.toml's."""
        return (self.folder,) if self.config_file is None else (self.folder, self.config_file.parent)

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

    def to_wire(self) -> dict[str, Any]:
        """The spec as JSON, for the engine process's workers: they serve what it built, without reading
        files that may have changed since (outputs as the probe found them included)."""
        outputs = None
        if self.outputs is not None:
            outputs = [[o.name, list(o.shape), o.datatype, o.classes] for o in self.outputs.outputs]
        return {"name": self.name, "folder": str(self.folder), "config": self.config.model_dump(mode="json"),
                "class_names": list(self.class_names), "version": self.version, "outputs": outputs,
                "config_file": None if self.config_file is None else str(self.config_file)}  # fmt: skip

    @staticmethod
    def from_wire(fields: dict[str, Any]) -> ModelSpec:
        outputs = fields["outputs"]
        layout = None if outputs is None else OutputLayout.of([(n, tuple(s), d, c) for n, s, d, c in outputs])
        config_file = fields["config_file"]
        return ModelSpec(name=fields["name"], folder=Path(fields["folder"]),
                         config=ModelConfig.model_validate(fields["config"]), class_names=tuple(fields["class_names"]),
                         version=fields["version"], config_file=None if config_file is None else Path(config_file),
                         outputs=layout)  # fmt: skip

    def path(self, relative: str) -> Path:
        """A file model.toml names: the first of `folders` that holds it (the version's, if none does)."""
        return next((f / relative for f in self.folders if (f / relative).exists()), self.folder / relative)
