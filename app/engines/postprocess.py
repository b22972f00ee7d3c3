"""What a batch's logits become before they leave the device: model.toml's `postprocess`.

    softmax   probabilities over the classes, one per row summing to 1 (the default)
    sigmoid   an independent probability per class (multi-label models)
    none      the model's own outputs as they are (a model that ends in its own softmax)

Applied inside the captured graph (or the eager forward), so the host receives the final scores.
A model of several named outputs (model.toml's [[outputs]]) has them packed into one (b, width)
fp32 row per image first (`packed`), and the postprocess touches its class-scores columns alone.
"""

from __future__ import annotations

import numpy as np
import torch

from app.repository.model_config import Postprocess
from app.repository.outputs import OutputLayout


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


def packed(returned: object, layout: OutputLayout) -> torch.Tensor:
    """The model's return value → (b, width) fp32: each output flattened, cast and concatenated in the
    layout's order (a tuple in its order, a dict by name). The default layout's one tensor is only cast."""
    if layout.default:
        assert isinstance(returned, torch.Tensor)
        return returned.float()  # (b, classes)
    if isinstance(returned, torch.Tensor):
        parts = [returned]
    elif isinstance(returned, dict):
        parts = [returned[name] for name in layout.names]
    else:
        parts = list(returned)  # type: ignore[call-overload]
    return torch.cat([part.reshape(part.shape[0], -1).float() for part in parts], dim=1)


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


def packed_numpy(returned: list[np.ndarray], layout: OutputLayout, kind: Postprocess) -> np.ndarray:
    """The same on the host, for ONNX Runtime: its outputs in the layout's order → (b, width) float32, finished."""
    if layout.default:
        return scores_numpy(returned[0], kind)
    rows = np.concatenate([part.reshape(len(part), -1).astype(np.float32) for part in returned], axis=1)
    classes = layout.classes
    if classes is not None and kind != "none":
        rows[:, classes.columns] = scores_numpy(rows[:, classes.columns], kind)
    return rows
