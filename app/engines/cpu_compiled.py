"""engine = "compile" on the CPU: torch.compile'd, each bucket compiled and checked at start-up, or the eager module.

torch.compile compiles a static shape at its first call. Built lazily, a machine without a C++ compiler (inductor's
InvalidCxxCompiler) loaded the model as ready and then failed every request with 500. As a GPU engine's graphs
are, each (bucket, input dtype) runs here once at build, against the eager module on the same pixels:

    for bucket in buckets, dtype in (uint8 pixels, float32 intensities):
        compiled(x) (bucket, width) ≈ eager(x) within TOLERANCE, relative

A compile that fails or differs serves the eager module instead, with a warning and `compile_fallback` saying why
(cgserve_compile_fallback, the model's description), or stops the start-up under compile_strict, as on a GPU.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from torch import nn

from app.engines.base import INPUT_DTYPES
from app.engines.cpu_eager import CpuEagerEngine
from app.engines.inductor import compile_module
from app.engines.postprocess import relative_error
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)

# fp32 on both sides, the same kernels' arithmetic reordered: a relative error of 1e-6 or so; 1e-4 leaves room for
# a fused kernel's other order without passing a wrong graph.
TOLERANCE = 1e-4


class CompileMismatch(RuntimeError):
    pass


def cpu_compiled_engine(module: nn.Module, spec: ModelSpec, buckets: tuple[int, ...], *, mode: str, strict: bool,
                        in_flight: int) -> CpuEagerEngine:  # fmt: skip
    """A CpuEagerEngine of `module` torch.compile'd in `mode`, every bucket compiled and checked now; where that
    fails, one of the eager module with report.compile_fallback saying why (strict: the failure is raised)."""
    started = time.perf_counter()
    compiled = compile_module(module, mode, len(buckets) * len(INPUT_DTYPES))
    engine = CpuEagerEngine(compiled, spec, buckets, in_flight=in_flight, name="compile")  # type: ignore[arg-type]
    reference = CpuEagerEngine(module, spec, buckets, in_flight=1)
    try:
        warm_up_against(engine, reference)
    except Exception as error:  # inductor's errors (no C++ compiler, a recompile limit), a mismatch
        engine.close()
        if strict:
            raise
        why = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        log.warning("%s: torch.compile (%s) failed on the CPU, serving the eager module instead (compile_strict = "
                    "true refuses to start): %s", spec.name, mode, why)  # fmt: skip
        engine = CpuEagerEngine(module, spec, buckets, in_flight=in_flight)
        engine.report.compile_fallback = why
    finally:
        reference.close()
    # As a GPU engine's: what was asked for (cgserve_compile_fallback is set for engines that say), and the compiles'
    # time in the start-up's.
    engine.report.facts["torch_compile_mode"] = mode
    engine.report.startup_seconds = time.perf_counter() - started
    return engine


def warm_up_against(engine: CpuEagerEngine, reference: CpuEagerEngine) -> None:
    """Each bucket and input dtype through `engine` (compiling it) and `reference` on the same random input:
    CompileMismatch where their outputs differ beyond TOLERANCE."""
    generator = np.random.default_rng(0)
    slot, expected = engine.slots[0], reference.slots[0]
    for bucket in engine.buckets:
        for dtype in INPUT_DTYPES:
            pixels = generator.integers(0, 256, (bucket, *engine.spec.input_shape), dtype=np.uint8)
            x = pixels if dtype == "uint8" else pixels.astype(np.float32) / 255  # (bucket, C, H, W)
            slot.inputs[dtype][:bucket] = x
            expected.inputs[dtype][:bucket] = x
            engine._forward(slot.inputs[dtype][:bucket], slot.outputs)
            reference._forward(expected.inputs[dtype][:bucket], expected.outputs)
            got, want = torch.from_numpy(slot.outputs[:bucket]), torch.from_numpy(expected.outputs[:bucket])
            error = relative_error(got, want, engine.spec.layout)
            if not error <= TOLERANCE:
                raise CompileMismatch(f"bucket {bucket} ({dtype}): outputs differ from eager by {error:.2g} (relative)")
