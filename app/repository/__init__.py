"""The model repository: DIR/<name>/model.toml per model, as Triton keeps one folder per model.

`read_repository` parses every model.toml (cheap, no torch); `load_model` builds one model on
the CPU and checks that it maps (B, C, H, W) to (B, len(labels)). Both report every problem,
one line each, naming the file and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from app.model_config import ModelConfigError, read_labels, read_model_config
from app.model_spec import ModelSpec

__all__ = ["LoadedModel", "ModelConfigError", "load_model", "read_repository"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # safe in a URL path and a metric label
PROBE_BATCH = 2


def read_repository(folder: Path) -> list[ModelSpec]:
    problems: list[str] = []
    specs: list[ModelSpec] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        toml = sub / "model.toml"
        if not toml.is_file():
            problems.append(f"{sub}: no model.toml in this model folder")
            continue
        if not _NAME.match(sub.name):
            problems.append(f"{sub}: a model's folder name is its URL name: letters, digits, '.', '_' and '-' only")
            continue
        try:
            config = read_model_config(toml)
        except ModelConfigError as error:
            problems += error.problems
            continue
        specs.append(ModelSpec(name=sub.name, folder=sub, config=config, class_names=read_labels(config, sub)))
    if not specs and not problems:
        problems.append(f"{folder}: holds no model (expected {folder}/<name>/model.toml)")
    if problems:
        raise ModelConfigError(problems)
    return specs


@dataclass(frozen=True, slots=True)
class LoadedModel:
    spec: ModelSpec
    module: object | None  # torch.nn.Module for torch formats (on the CPU), None for ONNX files


def load_model(spec: ModelSpec) -> LoadedModel:
    """Build the model on the CPU and probe it with a (2, C, H, W) batch. Imports torch."""
    if spec.config.format == "onnx":
        from app.engines.onnx_runtime import probe_onnx

        shape = probe_onnx(spec, PROBE_BATCH)
        module = None
    else:
        import torch

        from app.repository.loaders import load_module

        module = load_module(spec)
        try:
            with torch.inference_mode():
                output = module(torch.rand((PROBE_BATCH, *spec.input_shape)))
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else (type(output).__name__,)
        except Exception as error:
            raise ModelConfigError(
                [f"{spec.folder / 'model.toml'}: input_shape: the model fails on a ({PROBE_BATCH}, "
                 f"{', '.join(map(str, spec.input_shape))}) batch: {type(error).__name__}: "
                 f"{' '.join(str(error).split())[:300]}"]
            ) from None  # fmt: skip
    check_output_shape(spec, shape)
    return LoadedModel(spec=spec, module=module)


def check_output_shape(spec: ModelSpec, shape: tuple[object, ...]) -> None:
    toml = spec.folder / "model.toml"
    if len(shape) != 2 or shape[0] != PROBE_BATCH:
        raise ModelConfigError(
            [f"{toml}: format: the model's output for a ({PROBE_BATCH}, C, H, W) batch is {list(shape)}, not "
             f"({PROBE_BATCH}, classes): serve a classifier that returns one row of logits per image"]
        )  # fmt: skip
    if shape[1] != spec.num_classes:
        raise ModelConfigError(
            [f"{toml}: labels: {spec.num_classes} labels for a model with {shape[1]} outputs; give one label per class"]
        )
