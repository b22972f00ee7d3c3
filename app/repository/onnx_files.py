"""An ONNX file as the repository reads it: its session, and its input checked against model.toml.

Opened here, at load, to probe the model's output and name a wrong input shape before any engine is
built; the ONNX Runtime engine (app/engines/onnx_runtime.py) opens its own session the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.errors import error_line
from app.repository.model_config import ModelConfigError
from app.repository.model_spec import ModelSpec
from app.repository.probe import Seen

ONNX_FIX = "install onnxruntime (.venv/bin/pip install -e '.[onnx]' in the project)"


def open_session(spec: ModelSpec, providers: tuple[str, ...]) -> Any:
    """An InferenceSession for the model's file, or ModelConfigError naming what to fix."""
    toml = spec.toml
    try:
        import onnxruntime
    except ImportError as error:
        raise ModelConfigError([f"{toml}: format: onnx needs onnxruntime ({error}); {ONNX_FIX}"]) from None
    available = onnxruntime.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing:
        raise ModelConfigError([f"{toml}: providers: {missing} not in this onnxruntime build; it has {available}"])
    try:
        return onnxruntime.InferenceSession(str(spec.path(spec.config.file or "")), providers=list(providers))
    except Exception as error:
        raise ModelConfigError([f"{toml}: file: {error_line(error)}"]) from None


def probe_onnx(spec: ModelSpec, batch: int) -> list[Seen]:
    """Every output, named, for a (batch, C, H, W) input, on the CPU provider."""
    session = open_session(spec, ("CPUExecutionProvider",))
    toml = spec.toml
    declared = list(session.get_inputs()[0].shape)  # (N, C, H, W): ints where fixed, names where dynamic
    differ = shape_differences(spec.input_shape, declared)
    if differ:
        raise ModelConfigError([f"{toml}: input_shape: {differ}"])
    if isinstance(declared[0], int) and declared[0] > 0:  # it would load, then fail every batch of another size
        raise ModelConfigError(
            [f"{toml}: file: the ONNX model's input {declared} takes batches of {declared[0]} only; the server batches "
             "requests into buckets of several sizes: export it with a dynamic batch dimension (torch.onnx.export's "
             "dynamic_axes={'x': {0: 'N'}}, or dynamic_shapes)"]
        )  # fmt: skip
    x = np.zeros((batch, *spec.input_shape), dtype=np.float32)
    try:
        outputs = session.run(None, {session.get_inputs()[0].name: x})
    except Exception as error:
        fixed_batch = isinstance(declared[0], int) and declared[0] != batch
        why = " (export it with a dynamic batch dimension)" if fixed_batch else ""
        raise ModelConfigError(
            [f"{toml}: input_shape: the ONNX model fails on a {list(x.shape)} batch{why}: "
             f"{error_line(error)}"]
        ) from None  # fmt: skip
    names = [output.name for output in session.get_outputs()]
    return [
        Seen(name, tuple(np.shape(value)), str(np.asarray(value).dtype), _magnitude(np.asarray(value)))
        for name, value in zip(names, outputs, strict=True)
    ]


def _magnitude(value: np.ndarray) -> float:
    return float(np.abs(value).max()) if value.size and value.dtype.kind in "iuf" else 0.0


def shape_differences(input_shape: tuple[int, int, int], declared: list[object]) -> str | None:
    """What differs between model.toml's (C, H, W) and the ONNX input's fixed (N, C, H, W) dimensions."""
    if len(declared) != 4:
        return f"the ONNX model's input has {len(declared)} dimensions {declared}, not 4 (N, C, H, W)"
    names = ("channels", "height", "width")
    differ = [
        f"{name} {ours} in model.toml, {theirs} in the model"
        for name, ours, theirs in zip(names, input_shape, declared[1:], strict=True)
        if isinstance(theirs, int) and theirs > 0 and theirs != ours
    ]
    if not differ:
        return None
    return f"{list(input_shape)} is (C, H, W) and the ONNX input is {declared}: " + "; ".join(differ)
