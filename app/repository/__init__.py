"""The model repository: DIR/<name>/model.toml per model, as Triton keeps one folder per model,
or DIR/model.toml alone, one model (KServe's storageUri layout, named from INFERENCE_SERVICE_NAME).

A model folder may hold numbered version folders (app/repository/versions.py): one spec per
served version. `read_repository` parses every model.toml (cheap, no torch); `load_model` builds one model on
the CPU and probes what it returns (app/repository/probe.py): (B, len(labels)) class scores, or
the named outputs of model.toml's [[outputs]]. Both report every problem,
one line each, naming the file and the key.

The repository is trusted code: a python factory runs with the server's rights. What a model.toml
names (file, weights, labels) must still lie inside its model's folder, symlinks resolved, so
that a mistake or a copied model.toml cannot serve another file of the host.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

from app.repository.model_config import ModelConfigError, read_labels, read_model_config
from app.repository.model_spec import ModelSpec
from app.repository.probe import PROBE_BATCH, SECOND_BATCH, Seen, layout_of, torch_probe
from app.repository.versions import DEFAULT_POLICY, UNVERSIONED, version_folders

__all__ = [
    "LoadedModel",
    "ModelConfigError",
    "load_model",
    "model_folders",
    "read_each_model",
    "read_model",
    "read_repository",
]

# Safe in a URL path and a metric label; matched whole (fullmatch: `$` would let a final newline in).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Set by KServe in the predictor's container: the InferenceService's name, which it routes by.
SERVICE_NAME_VARIABLE = "INFERENCE_SERVICE_NAME"


def read_repository(folder: Path) -> list[ModelSpec]:
    """Every served (model, version)'s spec, each model's newest version first; ModelConfigError with every
    model's problems at once."""
    specs, problems = read_each_model(folder)
    if problems:
        raise ModelConfigError(problems)
    return specs


def read_each_model(folder: Path) -> tuple[list[ModelSpec], list[str]]:
    """The specs of the models that read cleanly, and the problems of the rest: start-up loads the first
    and reports what loading them finds with the second, so that one run shows everything to fix."""
    return _read_models(model_folders(folder))


def model_folders(folder: Path) -> list[tuple[str, Path, str]]:
    """(name, folder, where to name in a problem) of every model in the repository; nothing parsed."""
    if (folder / "model.toml").is_file():  # one model in the folder itself (KServe's storageUri)
        name = os.environ.get(SERVICE_NAME_VARIABLE) or folder.resolve().name
        where = f"{folder}: {SERVICE_NAME_VARIABLE}" if os.environ.get(SERVICE_NAME_VARIABLE) else str(folder)
        return [(name, folder, where)]
    models = [
        (sub.name, sub, str(sub)) for sub in sorted(folder.iterdir()) if sub.is_dir() and sub.name[:1] not in "._"
    ]
    if not models:
        raise ModelConfigError(
            [f"{folder}: holds no model (expected {folder}/<name>/model.toml or {folder}/model.toml)"]
        )
    return models


def read_model(repository: Path, name: str) -> list[ModelSpec]:
    """One model's served versions, read afresh (model control's load); ModelConfigError if it has none."""
    for found, folder, where in model_folders(repository):
        if found == name:
            specs, problems = _read_models([(name, folder, where)])
            if problems:
                raise ModelConfigError(problems)
            return specs
    raise ModelConfigError([f"{repository}: holds no model named {name!r}"])


def _read_models(models: list[tuple[str, Path, str]]) -> tuple[list[ModelSpec], list[str]]:
    """(name, folder, where to name in a problem) → the versions' specs of those that read cleanly, and the
    others' problems."""
    problems: list[str] = []
    specs: list[ModelSpec] = []
    for name, folder, where in models:
        if not _NAME.fullmatch(name):
            problems.append(
                f"{_printable(where)}: a model's name {name!r} is its URL name: a letter or digit, then letters, "
                "digits, '.', '_' and '-' only"
            )
            continue
        try:
            specs += _read_versions(name, folder)
        except ModelConfigError as error:
            problems += error.problems
    return specs, problems


def _read_versions(name: str, folder: Path) -> list[ModelSpec]:
    """The versions of one model folder its version_policy serves, newest first (app/repository/versions.py)."""
    shared = folder / "model.toml"
    versions = version_folders(folder)
    if not versions:  # the unversioned layout: the folder is version 1
        if not shared.is_file():
            raise ModelConfigError([f"{folder}: no model.toml in this model folder"])
        spec = _read_spec(name, folder, shared, UNVERSIONED)
        policy = spec.config.version_policy
        if policy is not None and policy.specific is not None and int(UNVERSIONED) not in policy.specific.versions:
            raise ModelConfigError(  # it served the folder as version 1 without a word
                [f"{shared}: version_policy: versions {list(policy.specific.versions)} have no folder in {folder}: it "
                 "holds no numbered version folders, and is served as version 1"]
            )  # fmt: skip
        return [spec]
    # The policy: <name>/model.toml's, else the newest version's own.
    newest = versions[max(versions)]
    source = shared if shared.is_file() else newest / "model.toml"
    if not source.is_file():
        raise ModelConfigError([f"{newest}: no model.toml in this version folder nor in {folder}"])
    policy = read_model_config(source, (newest, folder)).version_policy or DEFAULT_POLICY
    chosen, missing = policy.select(list(versions))
    if missing:
        raise ModelConfigError(
            [f"{source}: version_policy: versions {missing} have no folder in {folder} (it holds {sorted(versions)})"]
        )
    specs = []
    for version in chosen:
        own = versions[version] / "model.toml"
        if not own.is_file() and not shared.is_file():
            raise ModelConfigError([f"{versions[version]}: no model.toml in this version folder nor in {folder}"])
        specs.append(_read_spec(name, versions[version], own if own.is_file() else shared, str(version)))
    return specs


def _read_spec(name: str, folder: Path, toml: Path, version: str) -> ModelSpec:
    """One version: its files in `folder`, its model.toml `toml` (in `folder`, or the model's folder above)."""
    config_file = None if toml.parent == folder else toml
    folders = (folder,) if config_file is None else (folder, toml.parent)
    config = read_model_config(toml, folders)
    spec = ModelSpec(name=name, folder=folder, config=config, class_names=(), version=version, config_file=config_file)
    if isinstance(config.labels, str) and (outside := _outside(spec.home, config.labels, spec.path(config.labels))):
        raise ModelConfigError([f"{toml}: labels: {outside}"])
    return dataclasses.replace(spec, class_names=read_labels(config, folders, toml))


def _outside(folder: Path, relative: str, found: Path | None = None) -> str | None:
    """Why `relative` (a model.toml's file, weights or labels; `found` where it was looked up, default
    folder/relative) is not a file inside `folder`, or None."""
    resolved, home = (found or folder / relative).resolve(), folder.resolve()
    if resolved.is_relative_to(home):
        return None
    how = "an absolute path" if Path(relative).is_absolute() else "a path (through '..' or a symlink)"
    return (
        f"{relative!r} is {how} that leads out of the model's folder, to {resolved}; "
        "keep the model's files inside its folder"
    )


def _printable(text: str) -> str:
    """A path for a one-line problem: control characters (a newline) as escapes."""
    return text if text.isprintable() else repr(text)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    spec: ModelSpec
    module: object | None  # torch.nn.Module for torch formats (on the CPU), None for ONNX files


def load_model(spec: ModelSpec) -> LoadedModel:
    """Build the model on the CPU and probe it with a (2, C, H, W) batch (and a (3, C, H, W) one where
    model.toml names [[outputs]]): the spec it returns carries the outputs found. Imports torch."""
    toml = spec.toml
    outside = [f"{toml}: {key}: {why}" for key in ("file", "weights") if (why := _named_file_outside(spec, key))]
    if outside:
        raise ModelConfigError(outside)
    batches = (PROBE_BATCH,) if spec.config.outputs is None else (PROBE_BATCH, SECOND_BATCH)
    seen: dict[int, list[Seen]] = {}
    if spec.config.format == "onnx":
        from app.repository.onnx_files import probe_onnx

        kind, module = "onnx", None
        for batch in batches:
            seen[batch] = probe_onnx(spec, batch)
    else:
        from app.repository.loaders import load_module

        module = load_module(spec)
        for batch in batches:
            kind, seen[batch] = torch_probe(spec, module, batch)
    layout = layout_of(spec, kind, seen)  # a model without [[outputs]]: its spec's own layout, unchanged
    return LoadedModel(spec=spec if layout.default else dataclasses.replace(spec, outputs=layout), module=module)


def _named_file_outside(spec: ModelSpec, key: str) -> str | None:
    value: str | None = getattr(spec.config, key)
    return None if value is None else _outside(spec.home, value, spec.path(value))
