"""What a model returns for a small batch on the CPU, checked against model.toml: its OutputLayout.

load_model runs the model on a (2, C, H, W) batch, and where model.toml names [[outputs]] on a
(3, C, H, W) one too: every output must have the batch as its first dimension and the same shape
per image whatever the batch (the engines pack rows of a fixed width). Each problem is one line
naming the model.toml and the key to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.errors import error_line
from app.repository.model_config import ModelConfigError, OutputConfig
from app.repository.model_spec import ModelSpec
from app.repository.outputs import EXACT_INTEGER, OBSERVED, OutputLayout

PROBE_BATCH = 2
SECOND_BATCH = 3  # where [[outputs]] are named: a shape that follows the batch otherwise shows here


@dataclass(frozen=True, slots=True)
class Seen:
    """One tensor the model returned."""

    key: str | None  # its dict key or ONNX output name; None in a tuple or alone
    shape: tuple[int, ...]  # the whole tensor's, batch first
    dtype: str  # torch's or numpy's name: "float32", "int64" …
    magnitude: float  # its largest |value| (0 for an empty tensor): integers travel as float32


def seen_torch(output: object) -> tuple[str, list[Seen]]:
    """("tensor" | "tuple" | "dict" | the type's name, what it holds) of a torch model's return value."""
    import torch

    def seen(key: str | None, tensor: torch.Tensor) -> Seen:
        magnitude = float(tensor.detach().abs().max()) if tensor.numel() and tensor.dtype != torch.bool else 0.0
        return Seen(key, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), magnitude)

    if isinstance(output, torch.Tensor):
        return "tensor", [seen(None, output)]
    if isinstance(output, tuple | list) and output and all(isinstance(t, torch.Tensor) for t in output):
        return "tuple", [seen(None, t) for t in output]
    if isinstance(output, dict) and output and all(isinstance(t, torch.Tensor) for t in output.values()):
        return "dict", [seen(str(key), t) for key, t in output.items()]
    return type(output).__name__, []


def layout_of(spec: ModelSpec, kind: str, seen: dict[int, list[Seen]]) -> OutputLayout:
    """The model's OutputLayout from what it returned for each probe batch (`kind`: seen_torch's, or
    "onnx" for an ONNX file's named outputs); ModelConfigError where it differs from model.toml."""
    declared = spec.config.outputs
    first = seen[PROBE_BATCH]
    if declared is None:
        if kind not in ("tensor", "onnx"):
            returned = _returned(kind, first)
            raise _error(spec, "format", f"the model returns {returned}; name its outputs in model.toml's [[outputs]]")
        _check_scores(spec, first[0].shape)
        return OutputLayout.scores(spec.num_classes)
    matched = {batch: _match(spec, kind, declared, found) for batch, found in seen.items()}
    problems, named = [], []
    for index, output in enumerate(declared):
        shapes = {batch: found[index].shape for batch, found in matched.items()}
        one = matched[PROBE_BATCH][index]
        why = _problem(spec, output, one, shapes)
        if why:
            problems.append(f"{spec.toml}: outputs.{output.name}: {why}")
            continue
        named.append((output.name, one.shape[1:], OBSERVED[one.dtype], output.classes))
    if problems:
        raise ModelConfigError(problems)
    return OutputLayout.of(named)


def _problem(spec: ModelSpec, output: OutputConfig, seen: Seen, shapes: dict[int, tuple[int, ...]]) -> str | None:
    if any(len(shape) == 0 or shape[0] != batch for batch, shape in shapes.items()):
        described = " and ".join(f"{list(shape)} for a batch of {batch}" for batch, shape in shapes.items())
        return f"its shape is {described}: the batch must be its first dimension"
    rows = {shape[1:] for shape in shapes.values()}
    if len(rows) > 1:
        described = " and ".join(f"{list(shape)} for a batch of {batch}" for batch, shape in shapes.items())
        return f"its shape is {described}: one image's part must not depend on the batch"
    if seen.dtype not in OBSERVED:
        return f"its dtype {seen.dtype} cannot be served; return one of {sorted(OBSERVED)}"
    datatype, per_image = OBSERVED[seen.dtype], seen.shape[1:]
    if output.datatype is not None and output.datatype != datatype:
        return f"model.toml says datatype {output.datatype}; the model returns {seen.dtype} ({datatype})"
    if output.shape is not None and output.shape != per_image:
        return f"model.toml says shape {list(output.shape)}; the model returns {list(per_image)} per image"
    if 0 in per_image:
        return f"it holds no values ({list(per_image)} per image)"
    if datatype not in ("FP32", "BOOL") and seen.magnitude > EXACT_INTEGER:
        return f"an integer output travels as float32, exact up to 2**24, and the model returned {seen.magnitude:.0f}"
    if output.classes and per_image != (spec.num_classes,):
        return (
            f"class scores are one row of len(labels) = {spec.num_classes} per image; the model returns "
            f"{list(per_image)}"
        )
    return None


def _match(spec: ModelSpec, kind: str, declared: tuple[OutputConfig, ...], found: list[Seen]) -> list[Seen]:
    """What the model returned, in model.toml's order of [[outputs]]."""
    names = [output.name for output in declared]
    if kind in ("tensor", "tuple") and len(found) == len(declared):
        return found
    if kind == "dict" and sorted(names) == sorted(seen.key or "" for seen in found):
        return sorted(found, key=lambda seen: names.index(seen.key or ""))
    if kind == "onnx" and set(names) <= {seen.key for seen in found}:  # an ONNX file's other outputs go unserved
        return [next(seen for seen in found if seen.key == name) for name in names]
    raise _error(spec, "outputs", f"model.toml names {names}; the model returns {_returned(kind, found)}")


def _returned(kind: str, found: list[Seen]) -> str:
    if kind == "tensor":
        return f"one tensor {list(found[0].shape)}"
    if kind == "tuple":
        return f"a tuple of {len(found)} tensors"
    if kind in ("dict", "onnx"):
        return f"{'a dict' if kind == 'dict' else 'ONNX outputs'} of {[seen.key for seen in found]}"
    return f"a {kind}, not a tensor, a tuple or a dict of tensors"


def _check_scores(spec: ModelSpec, shape: tuple[int, ...]) -> None:
    """A model without [[outputs]]: (B, classes) for a (B, C, H, W) batch, one label per class."""
    toml = spec.toml
    if len(shape) != 2 or shape[0] != PROBE_BATCH:
        raise ModelConfigError(
            [f"{toml}: format: the model's output for a ({PROBE_BATCH}, C, H, W) batch is {list(shape)}, not "
             f"({PROBE_BATCH}, classes): serve a classifier that returns one row of logits per image, or name "
             "its outputs in [[outputs]]"]
        )  # fmt: skip
    if shape[1] != spec.num_classes:
        raise ModelConfigError(
            [f"{toml}: labels: {spec.num_classes} labels for a model with {shape[1]} outputs; give one label per class"]
        )


def _error(spec: ModelSpec, key: str, message: str) -> ModelConfigError:
    return ModelConfigError([f"{spec.toml}: {key}: {message}"])


def torch_probe(spec: ModelSpec, module: Any, batch: int) -> tuple[str, list[Seen]]:
    """Run the module on a (batch, C, H, W) CPU batch: what it returned (ModelConfigError if it fails)."""
    import torch

    try:
        with torch.inference_mode():
            return seen_torch(module(torch.rand((batch, *spec.input_shape))))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit too: a model's code must not end the start-up with 0
        raise ModelConfigError(
            [f"{spec.toml}: input_shape: the model fails on a ({batch}, "
             f"{', '.join(map(str, spec.input_shape))}) batch: {error_line(error)}"]
        ) from None  # fmt: skip
