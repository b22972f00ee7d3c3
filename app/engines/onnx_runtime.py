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

import numpy as np

from app.engines.base import EngineReport, InputDtype, Slot, host_slot
from app.engines.postprocess import packed_numpy
from app.ops.daemon_thread import at_work
from app.repository.model_spec import ModelSpec
from app.repository.onnx_files import open_session


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
        # model.toml's [[outputs]] by the file's output names (the others are not computed); else its first.
        self._output_names = None if spec.layout.default else list(spec.layout.names)
        self.device = "cuda" if providers[0].startswith(("CUDA", "Tensorrt")) else "cpu"
        preprocess = spec.preprocess
        channel = (1, -1, 1, 1)
        self._mean = None if preprocess.mean is None else np.array(preprocess.mean, np.float32).reshape(channel)
        self._std = None if preprocess.std is None else np.array(preprocess.std, np.float32).reshape(channel)
        self.slots = tuple(host_slot(i, buckets[-1], spec.input_shape, spec.layout.width) for i in range(in_flight))
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
        with at_work():  # a run that never returns does not hold a stop
            returned = self._session.run(
                self._output_names, {self._input_name: np.ascontiguousarray(x, dtype=np.float32)}
            )
        # (b, width): the class scores, or every named output packed; checked (b, *shape) each before it is written
        outputs[: len(inputs)] = packed_numpy(returned[: len(self.spec.layout.outputs)], self.spec.layout,
                                              self.spec.config.postprocess, len(inputs))  # fmt: skip
        return time.perf_counter() - start

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        # Not waited for: the batcher has waited for its batches, and one still running is stuck in the model's code.
        self._executor.shutdown(wait=False, cancel_futures=True)
