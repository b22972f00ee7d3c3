"""What a batch's logits become before they leave the device: model.toml's `postprocess`.

    softmax   probabilities over the classes, one per row summing to 1 (the default)
    sigmoid   an independent probability per class (multi-label models)
    none      the model's own outputs as they are (a model that ends in its own softmax)

Applied inside the captured graph (or the eager forward), so the host receives the final scores.
A model of several named outputs (model.toml's [[outputs]]) has them packed into one (b, width)
fp32 row per image first (`packed`), and the postprocess touches its class-scores columns alone.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

from app.repository.model_config import Postprocess
from app.repository.outputs import Output, OutputLayout

# One output as the model returned it: torch's, or ONNX Runtime's array.
Part = TypeVar("Part", torch.Tensor, np.ndarray)


def scores(logits: torch.Tensor, kind: Postprocess) -> torch.Tensor:
    """(b, classes) fp32 logits → (b, classes) fp32 scores; `none` returns `logits` itself."""
    if kind == "softmax":
        return torch.softmax(logits, dim=1)
    if kind == "sigmoid":
        return torch.sigmoid(logits)
    return logits


def scores_into(logits: torch.Tensor, kind: Postprocess, out: torch.Tensor) -> None:
    """Write `scores(logits, kind)` into `out` (b, classes) fp32 without another buffer."""
    if kind == "softmax":
        torch.ops.aten._softmax.out(logits, 1, False, out=out)
    elif kind == "sigmoid":
        torch.sigmoid(logits, out=out)
    else:
        out.copy_(logits)


def scores_numpy(logits: np.ndarray, kind: Postprocess) -> np.ndarray:
    """The same on the host, for engines whose model runs outside torch (ONNX Runtime)."""
    if kind == "softmax":
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)
    if kind == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    return logits


# --- several named outputs (app/repository/outputs.py) ---------------------------------------------


class ModelOutputError(RuntimeError):
    """The model returned what its model.toml does not declare for the batch it was given: another shape, another
    count of rows, another kind of value. Checked before anything is written into the batch's output rows, which
    would otherwise keep an earlier batch's scores or broadcast one row over all (another client's answers)."""


def packed(returned: object, layout: OutputLayout, batch: int) -> torch.Tensor:
    """The model's return value for `batch` images → (batch, width) fp32: each output flattened, cast and
    concatenated in the layout's order (a tuple in its order, a dict by name). The default layout's one tensor is
    only cast. ModelOutputError where an output is not (batch, *its shape)."""
    if layout.default:
        if not isinstance(returned, torch.Tensor):
            raise ModelOutputError(
                f"the model returned a {type(returned).__name__} for a batch of {batch}; expected one "
                f"({batch}, {layout.width}) tensor (or [[outputs]] in model.toml naming them)"
            )
        return batch_rows(returned, batch, layout.outputs[0]).float()  # (b, classes)
    if isinstance(returned, torch.Tensor):
        parts = [returned]
    elif isinstance(returned, dict):
        missing = [name for name in layout.names if name not in returned]
        if missing:
            raise ModelOutputError(f"the model's dict lacks {missing}; expected the outputs {list(layout.names)}")
        parts = [returned[name] for name in layout.names]
    elif isinstance(returned, (tuple, list)):
        parts = list(returned)
    else:
        raise ModelOutputError(f"the model returned a {type(returned).__name__}; expected a tensor, tuple or dict of "
                               f"the outputs {list(layout.names)}")  # fmt: skip
    if len(parts) != len(layout.outputs) or not all(isinstance(part, torch.Tensor) for part in parts):
        raise ModelOutputError(f"the model returned {len(parts)} values; expected {len(layout.outputs)} tensors, the "
                               f"outputs {list(layout.names)} in that order")  # fmt: skip
    parts = [batch_rows(part, batch, output) for part, output in zip(parts, layout.outputs, strict=True)]
    return torch.cat([part.reshape(batch, -1).float() for part in parts], dim=1)


def batch_rows(part: Part, batch: int, output: Output) -> Part:
    """One output of the model for `batch` images (a tensor, or ONNX Runtime's array) as (batch, *its shape):
    ModelOutputError where it is not. A batch of one returned without its batch dimension (a model ending in
    .squeeze()) is its one row: such models were served before the shapes were checked."""
    if batch == 1 and tuple(part.shape) == output.shape:
        return part[None]
    expected = (batch, *output.shape)
    if tuple(part.shape) != expected:
        raise ModelOutputError(f"the model returned {output.name} of shape {tuple(part.shape)} for a batch of {batch}; "
                               f"expected {expected}: one row an image, each as model.toml declares")  # fmt: skip
    return part


def relative_error(got: torch.Tensor, want: torch.Tensor, layout: OutputLayout) -> float:
    """‖got − want‖ / ‖want‖ of (b, width) rows (logits or finished scores); of named outputs, the largest of any
    one output's: one output's scale must not hide another's error (boxes in pixels beside scores in [0, 1]), and an
    output of zeros must be zeros. How a GPU engine's graphs and a CPU engine's compiled module are checked."""
    if layout.default:
        return float((got - want).norm() / want.norm())
    return max(
        float((got[:, o.columns] - want[:, o.columns]).norm() / want[:, o.columns].norm().clamp_min(1e-12))
        for o in layout.outputs
    )


def finished(rows: torch.Tensor, layout: OutputLayout, kind: Postprocess) -> torch.Tensor:
    """(b, width) packed fp32 → the same with `kind` applied to the class-scores output's columns alone."""
    classes = layout.classes
    if layout.default or classes is None or kind == "none":
        return scores(rows, kind) if layout.default else rows
    end = classes.offset + classes.size
    return torch.cat((rows[:, : classes.offset], scores(rows[:, classes.columns], kind), rows[:, end:]), dim=1)


def finished_into(rows: torch.Tensor, layout: OutputLayout, kind: Postprocess, out: torch.Tensor) -> None:
    """Write `finished(rows, layout, kind)` into `out` (b, width); the default layout without another buffer."""
    if layout.default:
        scores_into(rows, kind, out)
    else:
        out.copy_(finished(rows, layout, kind))


def packed_numpy(returned: list[np.ndarray], layout: OutputLayout, kind: Postprocess, batch: int) -> np.ndarray:
    """The same on the host, for ONNX Runtime: its outputs for `batch` images in the layout's order → (batch, width)
    float32, finished; ModelOutputError where an output is not (batch, *its shape)."""
    returned = [batch_rows(part, batch, output) for part, output in zip(returned, layout.outputs, strict=True)]
    if layout.default:
        return scores_numpy(returned[0], kind)
    rows = np.concatenate([part.reshape(batch, -1).astype(np.float32) for part in returned], axis=1)
    classes = layout.classes
    if classes is not None and kind != "none":
        rows[:, classes.columns] = scores_numpy(rows[:, classes.columns], kind)
    return rows
