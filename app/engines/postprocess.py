"""What a batch's logits become before they leave the device: model.toml's `postprocess`.

    softmax   probabilities over the classes, one per row summing to 1 (the default)
    sigmoid   an independent probability per class (multi-label models)
    none      the model's own outputs as they are (a model that ends in its own softmax)

Applied inside the captured graph (or the eager forward), so the host receives the final scores.
"""

from __future__ import annotations

import numpy as np
import torch

from app.repository.model_config import Postprocess


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
