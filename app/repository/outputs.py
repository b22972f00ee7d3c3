"""A model's outputs, named: what it returns for a batch, and how one packed row is cut back into them.

    [[outputs]]                 # model.toml, in the model's return order (a tuple), or its dict's keys
    name = "boxes"
    datatype = "INT64"          # optional, checked at load: FP32 | INT64 | INT32 | INT16 | INT8 | UINT8 | BOOL
    shape = [100, 4]            # optional, checked at load: one image's, without the batch dimension
    classes = true              # class scores: postprocess, labels and the classification extension

Without [[outputs]] a model returns one tensor (B, len(labels)): the class scores "probabilities", as
every model always has (`OutputLayout.scores`).

Every output travels as float32 in one row per image, (B, width): each flattened, cast and
concatenated in the order above, inside the engine's forward (the captured graph on a GPU), so the
device-to-host copy stays one copy and the batcher, its slots and the engine process move (rows,
width) float32 whatever the model. Integers are exact in float32 up to 2**24 (a detector's labels,
indices, counts): the probe refuses an integer output it sees beyond that, and the answer casts
each back to its datatype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from math import prod
from typing import Any

import numpy as np

# The Open Inference Protocol's datatypes an output may have, and their numpy dtypes (little-endian).
DATATYPES: dict[str, np.dtype[Any]] = {
    "FP32": np.dtype("<f4"),
    "INT64": np.dtype("<i8"),
    "INT32": np.dtype("<i4"),
    "INT16": np.dtype("<i2"),
    "INT8": np.dtype("i1"),
    "UINT8": np.dtype("u1"),
    "BOOL": np.dtype(np.bool_),
}
# A tensor's dtype (torch's or numpy's name, without "torch.") → the datatype it is served as.
OBSERVED = {
    "float32": "FP32", "float16": "FP32", "bfloat16": "FP32", "float64": "FP32",
    "int64": "INT64", "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL",
}  # fmt: skip
EXACT_INTEGER = 2**24  # float32 holds every integer of at most this magnitude exactly
DEFAULT_NAME = "probabilities"  # the class-scores output of a model without [[outputs]]


@dataclass(frozen=True, slots=True)
class Output:
    name: str
    shape: tuple[int, ...]  # one image's, without the batch dimension; () for a number per image
    datatype: str  # one of DATATYPES
    classes: bool  # class scores: postprocess applies, labels name them, classification answers them
    offset: int  # its first column in the packed (B, width) float32 row

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def columns(self) -> slice:
        return slice(self.offset, self.offset + self.size)


@dataclass(frozen=True, slots=True)
class OutputLayout:
    outputs: tuple[Output, ...]
    width: int  # float32 columns of one packed row: every output's size
    default: bool = False  # one tensor (B, classes): the model returns it as it is, nothing to pack

    @staticmethod
    @cache
    def scores(classes: int) -> OutputLayout:
        """The layout of a model without [[outputs]]: its one tensor, the class scores "probabilities"."""
        return OutputLayout((Output(DEFAULT_NAME, (classes,), "FP32", True, 0),), classes, default=True)

    @staticmethod
    def of(named: list[tuple[str, tuple[int, ...], str, bool]]) -> OutputLayout:
        """(name, per-image shape, datatype, classes) in the model's order → their packed layout."""
        outputs, offset = [], 0
        for name, shape, datatype, classes in named:
            outputs.append(Output(name, shape, datatype, classes, offset))
            offset += prod(shape)
        return OutputLayout(tuple(outputs), offset)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(output.name for output in self.outputs)

    @property
    def classes(self) -> Output | None:
        """The class-scores output, where there is one."""
        return next((output for output in self.outputs if output.classes), None)

    def get(self, name: str) -> Output | None:
        return next((output for output in self.outputs if output.name == name), None)

    def cut(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """(k, width) float32 packed rows → each output (k, *shape) in its datatype (floats as views)."""
        cut = {}
        for output in self.outputs:
            values = rows[:, output.columns].reshape(len(rows), *output.shape)
            if output.datatype == "BOOL":
                values = values != 0
            elif output.datatype != "FP32":
                values = np.rint(values).astype(DATATYPES[output.datatype])
            cut[output.name] = values
        return cut
