"""ONNX Runtime behind the same interface and buckets: for models that arrive as .onnx files.

The session runs on one worker thread (ONNX Runtime releases the GIL), padded to the same
buckets as every engine. Execution providers are chosen by name in model.toml (`providers`,
default CPUExecutionProvider); a provider this onnxruntime build lacks stops start-up with the
list it has. The model input is built on the host here: uint8 / 255, then (x − mean) / std.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from app.engines.base import EngineReport, InputDtype, Slot, host_slot
from app.engines.postprocess import scores_numpy
from app.model_config import ModelConfigError
from app.model_spec import ModelSpec

ONNX_FIX = "install onnxruntime (pip install 'cudagraph-serve[onnx]')"


def open_session(spec: ModelSpec, providers: tuple[str, ...]) -> Any:
    """An InferenceSession for the model's file, or ModelConfigError naming what to fix."""
    toml = spec.folder / "model.toml"
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
        raise ModelConfigError(
            [f"{toml}: file: {type(error).__name__}: {' '.join(str(error).split())[:300]}"]
        ) from None


def probe_onnx(spec: ModelSpec, batch: int) -> tuple[object, ...]:
    """The output shape for a (batch, C, H, W) input, on the CPU provider."""
    session = open_session(spec, ("CPUExecutionProvider",))
    toml = spec.folder / "model.toml"
    declared = list(session.get_inputs()[0].shape)  # (N, C, H, W): ints where fixed, names where dynamic
    differ = shape_differences(spec.input_shape, declared)
    if differ:
        raise ModelConfigError([f"{toml}: input_shape: {differ}"])
    x = np.zeros((batch, *spec.input_shape), dtype=np.float32)
    try:
        (output, *_) = session.run(None, {session.get_inputs()[0].name: x})
    except Exception as error:
        fixed_batch = isinstance(declared[0], int) and declared[0] != batch
        why = " (export it with a dynamic batch dimension)" if fixed_batch else ""
        raise ModelConfigError(
            [f"{toml}: input_shape: the ONNX model fails on a {list(x.shape)} batch{why}: "
             f"{' '.join(str(error).split())[:300]}"]
        ) from None  # fmt: skip
    return tuple(np.shape(output))


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


class OnnxRuntimeEngine:
    name = "onnxruntime"

    def __init__(
        self, spec: ModelSpec, buckets: tuple[int, ...], *, providers: tuple[str, ...], in_flight: int = 2
    ) -> None:
        started = time.perf_counter()
        self.spec = spec
        self.buckets = buckets
        self._session = open_session(spec, providers)
        self._input_name = self._session.get_inputs()[0].name
        self.device = "cuda" if providers[0].startswith(("CUDA", "Tensorrt")) else "cpu"
        preprocess = spec.preprocess
        channel = (1, -1, 1, 1)
        self._mean = None if preprocess.mean is None else np.array(preprocess.mean, np.float32).reshape(channel)
        self._std = None if preprocess.std is None else np.array(preprocess.std, np.float32).reshape(channel)
        self.slots = tuple(host_slot(i, buckets[-1], spec.input_shape, spec.num_classes) for i in range(in_flight))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxruntime")
        self.report = EngineReport(
            facts={
                "dtype": "fp32",
                "providers": list(self._session.get_providers()),
                "postprocess": spec.config.postprocess,
            }
        )
        self.report.startup_seconds = time.perf_counter() - started

    async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._forward, slot.inputs[dtype][:bucket], slot.outputs)

    def _forward(self, inputs: np.ndarray, outputs: np.ndarray) -> float:
        start = time.perf_counter()
        x = inputs * np.float32(1 / 255) if inputs.dtype == np.uint8 else inputs  # (b, C, H, W) float32
        if self._mean is not None:
            x = x - self._mean
        if self._std is not None:
            x = x / self._std
        (logits, *_) = self._session.run(None, {self._input_name: np.ascontiguousarray(x, dtype=np.float32)})
        outputs[: len(inputs)] = scores_numpy(logits, self.spec.config.postprocess)  # (b, classes)
        return time.perf_counter() - start

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
