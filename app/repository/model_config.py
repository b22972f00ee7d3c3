"""One model's model.toml, parsed and checked: what a user writes to serve their own CNN.

    format = "torchscript" | "exported" | "onnx" | "torchvision" | "python"
    file = "model.pt"                      # torchscript, exported, onnx
    architecture = "resnet50"              # torchvision, with `arguments` and `weights`
    factory = "model:build"                # python: module found first in the model's folder
    input_shape = [3, 224, 224]            # (C, H, W) of one image
    labels = ["cat", "dog"] | "labels.txt" # one per output class (where the model has class scores)
    postprocess = "softmax"                # | "sigmoid" (multi-label) | "none" (the model's own scores)
    [[outputs]]                            # optional: the model's named outputs (app/repository/outputs.py)
    name = "boxes"; datatype = "FP32"; shape = [100, 4]; classes = false
    input_datatype = "UINT8"               # | "FP32": what the v2 metadata asks clients to send
    [preprocess]                           # image uploads; mean/std run inside the graph
    color = "RGB"; resize = 256; crop = 224; mean = [...]; std = [...]
    version_policy = { latest = { num_versions = 1 } }  # | { all = {} } | { specific = { versions = [1, 3] } }

Unknown keys are errors (a typo must not be ignored), and every problem is reported with the
file and the key, so a user fixes them all in one go.
"""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.config import Compile, Dtype, check_buckets, split_buckets
from app.repository.versions import VersionPolicy

Format = Literal["torchscript", "exported", "onnx", "torchvision", "python"]
ModelEngine = Literal["eager", "cuda-graph", "compile", "onnxruntime"]
Postprocess = Literal["softmax", "sigmoid", "none"]  # app/engines/postprocess.py applies it


class ModelConfigError(ValueError):
    """One or more problems with a model's configuration, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Preprocess(BaseModel):
    """How an uploaded image becomes the model's (C, H, W) uint8 pixels, and their normalisation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    color: Literal["L", "RGB"] | None = None  # default: L for C = 1, RGB for C = 3
    resize: Annotated[int, Field(ge=1)] | None = None  # shorter side, before the crop
    crop: Annotated[int, Field(ge=1)] | None = None  # centre crop, square
    # Per channel, on [0, 1] intensities: x ↦ (x − mean) / std, captured in the graph.
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @field_validator("std")
    @classmethod
    def _positive(cls, value: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if value is not None and any(s <= 0 for s in value):
            raise ValueError(f"every std must be positive; got {list(value)}")
        return value


class OutputConfig(BaseModel):
    """One of the model's outputs, in its return order: [[outputs]] in model.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=64)]
    datatype: Literal["FP32", "INT64", "INT32", "INT16", "INT8", "UINT8", "BOOL"] | None = None  # checked at load
    shape: tuple[Annotated[int, Field(ge=1)], ...] | None = None  # one image's; checked against the probe
    classes: bool = False  # class scores: postprocess, labels and the classification extension apply


# The keys that say where a model comes from, and the formats that read each: set for another format, a key is an
# error (a torchscript model given `weights` served the file's own weights, not those).
FORMAT_KEYS = {
    "file": ("torchscript", "exported", "onnx"),
    "weights": ("torchvision", "python"),
    "architecture": ("torchvision",),
    "arguments": ("torchvision",),
    "allow_random_weights": ("torchvision",),
    "factory": ("python",),
    "providers": ("onnx",),
}

# /predict answers a class-scores output as these fields beside the other outputs' names.
CLASS_FIELDS = ("label", "class_name", "scores")


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    format: Format
    input_shape: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]]
    labels: list[str] | str | None = None  # needed where the model has class scores
    file: str | None = None
    weights: str | None = None
    architecture: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    allow_random_weights: bool = False
    factory: str | None = None
    preprocess: Preprocess = Preprocess()
    # What the logits become, in the graph: a model that ends in its own softmax says "none".
    postprocess: Postprocess = "softmax"
    # The model's named outputs in its return order; unset: one tensor (B, len(labels)) of class scores.
    outputs: tuple[OutputConfig, ...] | None = None
    # The input datatype the Open Inference Protocol's metadata declares, so that Triton's clients and
    # perf_analyzer send it: UINT8 pixels are a quarter of FP32's bytes and the engine stages uint8 as
    # it comes. Both are accepted either way.
    input_datatype: Literal["UINT8", "FP32"] = "FP32"
    # Per-model engine options; unset means the service's setting of the same name.
    engine: ModelEngine | None = None
    dtype: Dtype | None = None
    channels_last: bool | None = None
    compile: Compile | None = None
    # A model whose compile fails (no C toolchain, a recompile limit) is served from a graph of the
    # eager module, with a warning; true refuses to start instead.
    compile_strict: bool | None = None
    compile_mode: Literal["reduce-overhead", "max-autotune", "default"] = "reduce-overhead"  # engine = "compile"
    buckets: tuple[int, ...] | None = None
    max_delay_ms: Annotated[float, Field(ge=0.0, le=1000.0)] | None = None
    providers: tuple[str, ...] = ("CPUExecutionProvider",)  # engine = "onnxruntime"
    # Which numbered version folders are served (app/repository/versions.py); unset: the newest one.
    version_policy: VersionPolicy | None = None

    _split_buckets = field_validator("buckets", mode="before")(split_buckets)

    @field_validator("buckets")
    @classmethod
    def _check_buckets(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if value is None else check_buckets(value)

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """(key, message) for what no single field can check: keys that go together."""
        problems = []
        needs = {"torchscript": "file", "exported": "file", "onnx": "file", "torchvision": "architecture"}
        needs["python"] = "factory"
        if getattr(self, needs[self.format]) is None:
            problems.append((needs[self.format], f'format "{self.format}" needs this key'))
        if self.format == "torchvision" and self.weights is None and not self.allow_random_weights:
            problems.append(
                ("weights", 'format "torchvision" needs a state-dict file here, or allow_random_weights = true '
                 "for a benchmark model with random weights")
            )  # fmt: skip
        for key, formats in FORMAT_KEYS.items():  # a key its format never reads would be ignored without a word
            if key in self.model_fields_set and self.format not in formats:
                used = " or ".join(f'"{f}"' for f in formats)
                problems.append((key, f'format "{self.format}" does not read this key (format {used} does); remove it'))
        if self.format == "onnx" and self.engine not in (None, "onnxruntime"):
            problems.append(("engine", f'"{self.engine}" cannot run an ONNX file; use "onnxruntime"'))
        if self.format != "onnx" and self.engine == "onnxruntime":
            problems.append(("engine", f'"onnxruntime" runs ONNX files only; this model\'s format is "{self.format}"'))
        problems += self._output_problems()
        channels = self.input_shape[0]
        for key in ("mean", "std"):
            values = getattr(self.preprocess, key)
            if values is not None and len(values) != channels:
                problems.append((f"preprocess.{key}", f"{len(values)} values for an input of {channels} channels"))
        color = self.preprocess.color
        if color is not None and {"L": 1, "RGB": 3}[color] != channels:
            problems.append(("preprocess.color", f'"{color}" does not give the {channels} channels of input_shape'))
        if color is None and channels not in (1, 3):
            message = f"{channels} channels; image uploads need 1 (L) or 3 (RGB)"
            c, h, w = self.input_shape
            if w in (1, 3):  # written as H, W, C, as images are stored
                message += f"; input_shape is C, H, W: [{w}, {c}, {h}]?"
            problems.append(("input_shape", message))
        return problems

    def _output_problems(self) -> list[tuple[str, str]]:
        if self.outputs is None:
            return [] if self.labels is not None else [("labels", "a model of class scores needs one label per class")]
        problems = []
        names = [output.name for output in self.outputs]
        classes = [output.name for output in self.outputs if output.classes]
        if not names:
            problems.append(("outputs", "an empty list; name the model's outputs, or leave the key out"))
        if len(set(names)) < len(names):
            problems.append(("outputs", f"names repeat: {names}; each output once"))
        if len(classes) > 1:
            problems.append(("outputs", f"{classes} are all marked classes = true; at most one output is class scores"))
        if classes and self.labels is None:
            problems.append(("labels", f'the class-scores output "{classes[0]}" needs one label per class'))
        if not classes and self.labels is not None:
            problems.append(("labels", "no output is marked classes = true, so there is nothing to label"))
        if not classes and self.postprocess != "none" and "postprocess" in self.model_fields_set:
            problems.append(
                ("postprocess", f'"{self.postprocess}" applies to class scores, and no output is marked classes = true')
            )
        clash = sorted(set(names) & set(CLASS_FIELDS)) if classes else []
        if clash:
            problems.append(
                ("outputs", f"{clash}: /predict answers the class scores as {list(CLASS_FIELDS)}; rename the output")
            )
        return problems

    @property
    def color(self) -> Literal["L", "RGB"]:
        return self.preprocess.color or ("L" if self.input_shape[0] == 1 else "RGB")


def read_model_config(path: Path, folders: tuple[Path, ...] | None = None) -> ModelConfig:
    """Parse DIR/<name>/model.toml; ModelConfigError lists every problem as `file: key: message`.

    `folders`: where the files it names are looked for, in order (a version's folder, then the
    model.toml's); default the model.toml's folder."""
    folders = folders or (path.parent,)
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise ModelConfigError([f"{path}: cannot be read: {error}"]) from None
    except tomllib.TOMLDecodeError as error:
        raise ModelConfigError([f"{path}: not valid TOML: {error}"]) from None
    try:
        config = ModelConfig.model_validate(document)
    except ValidationError as error:
        raise ModelConfigError([_problem(path, item) for item in error.errors()]) from None
    problems = [f"{path}: {key}: {message}" for key, message in config.cross_field_problems()]
    problems += [
        f"{path}: {key}: file {value!r} does not exist in {_names(folders)}"
        for key in ("file", "weights")
        if (value := getattr(config, key)) is not None and find(value, folders) is None
    ]
    if isinstance(config.labels, str) and find(config.labels, folders) is None:
        problems.append(f"{path}: labels: file {config.labels!r} does not exist in {_names(folders)}")
    if problems:
        raise ModelConfigError(problems)
    return config


def find(relative: str, folders: tuple[Path, ...]) -> Path | None:
    """The first folder's file of that name, or None."""
    return next((folder / relative for folder in folders if (folder / relative).is_file()), None)


def _names(folders: tuple[Path, ...]) -> str:
    return " or ".join(str(folder) for folder in folders)


def read_labels(config: ModelConfig, folders: tuple[Path, ...], toml: Path) -> tuple[str, ...]:
    """The labels list, or the lines of the labels file: line i names class i-1, blank lines at its end left out.
    ModelConfigError for a blank line before the last label: skipped, it would name every later class as the next
    one (Triton's label files are a line a class too)."""
    if config.labels is None:
        return ()
    if isinstance(config.labels, list):
        return tuple(config.labels)
    found = find(config.labels, folders)
    assert found is not None  # read_model_config checked it
    labels = [line.strip() for line in found.read_text().splitlines()]
    while labels and not labels[-1]:
        labels.pop()
    blank = [number for number, label in enumerate(labels, 1) if not label]
    if blank:
        raise ModelConfigError(
            [f"{toml}: labels: {found.name} has blank lines {blank[:10]} before its last label; each line names one "
             "class in class order (line 1 class 0): remove them, or give those classes names"]
        )  # fmt: skip
    return tuple(labels)


# What a table key takes, where pydantic's words ("a valid dictionary or instance of VersionPolicy") do not say.
TABLE_EXAMPLES = {
    "VersionPolicy": "{ latest = { num_versions = 1 } }, { all = {} } or { specific = { versions = [1, 3] } }",
}


def _problem(path: Path, item: Any) -> str:
    loc = tuple(item["loc"])
    key = ".".join(str(part) for part in loc) or "(file)"
    message = str(item["msg"]).removeprefix("Value error, ")
    if item["type"] == "extra_forbidden":
        message = _unknown_key(str(loc[-1]), _table_at(loc[:-1]))
    elif item["type"] == "model_type" and (wanted := _table_at(loc)) is not None:
        keys = ", ".join(wanted.model_fields)
        message = f"expected a table: {TABLE_EXAMPLES.get(wanted.__name__, f'with keys {keys}')}"
    return f"{path}: {key}: {message}"


def _unknown_key(key: str, table: type[BaseModel] | None) -> str:
    """What to say of a key `table` (None: not known here) does not have: the close one, or the table's keys."""
    if table is None:
        return "unknown key (a typo?)"
    known = list(table.model_fields)
    close = difflib.get_close_matches(key, known, n=1)
    message = f"unknown key: did you mean {close[0]!r}?" if close else "unknown key (a typo?)"
    if table is not ModelConfig:  # a table's few keys
        return f"{message}; expected one of {', '.join(known)}"
    return message if close else f"{message}; model.toml's keys are listed in docs/models.md"


def _table_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model.toml table (a pydantic model) at `loc`, a path of keys and list indexes from the top; None where
    that is not a table."""
    table: type[BaseModel] = ModelConfig
    for part in loc:
        if isinstance(part, int):  # an item of [[outputs]]: its table is the list's
            continue
        field = table.model_fields.get(str(part))
        found = _table_in(field.annotation) if field is not None else None
        if found is None:
            return None
        table = found
    return table


def _table_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (Preprocess; VersionPolicy | None; tuple[OutputConfig, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((table for arg in typing.get_args(annotation) if (table := _table_in(arg)) is not None), None)
