"""engine = "compile" on the CPU: every bucket compiled and checked against eager at build, or the eager module.

A model review found it built lazily: on a machine without a C++ compiler the model loaded as ready, then every
request got 500 (inductor's InvalidCxxCompiler). torch.compile stands in here for each outcome: a compile that
raises, one whose outputs differ, one that works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from app.engines import cpu_compiled
from app.engines.cpu_compiled import CompileMismatch, cpu_compiled_engine
from models.cnn import load_model
from tests.seed_model import seed_spec

BUCKETS = (1, 4)


def built(monkeypatch: pytest.MonkeyPatch, compiled: Callable[[nn.Module], Any], *, strict: bool = False) -> Any:
    calls: list[int] = []

    def compile_module(module: nn.Module, mode: str, shapes: int) -> Any:
        calls.append(shapes)
        return compiled(module)

    monkeypatch.setattr(cpu_compiled, "compile_module", compile_module)
    engine = cpu_compiled_engine(load_model(), seed_spec(), BUCKETS, mode="default", strict=strict, in_flight=2)
    assert calls == [len(BUCKETS) * 2]  # every bucket, pixels and intensities
    return engine


def test_a_compile_that_fails_at_its_first_call_serves_the_eager_module_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_cxx(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def call(x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        return call

    engine = built(monkeypatch, no_cxx)
    assert engine.name == "eager" and "InvalidCxxCompiler" in (engine.report.compile_fallback or "")
    assert engine.report.facts["torch_compile_mode"] == "default"  # what cgserve_compile_fallback is set for
    slot = engine.slots[0]
    slot.inputs["uint8"][:4] = 0
    engine._forward(slot.inputs["uint8"][:4], slot.outputs)  # it serves
    np.testing.assert_allclose(slot.outputs[:4].sum(axis=1), 1.0, rtol=1e-5)
    engine.close()
    with pytest.raises(RuntimeError, match="InvalidCxxCompiler"):  # compile_strict: start-up stops
        built(monkeypatch, no_cxx, strict=True)


def test_a_compile_whose_outputs_differ_from_eager_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    def off(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda x: module(x) * 2.0  # (softmax does not see a shift)

    engine = built(monkeypatch, off)
    assert engine.name == "eager" and "differ from eager" in (engine.report.compile_fallback or "")
    engine.close()
    with pytest.raises(CompileMismatch, match="bucket 1 \\(uint8\\)"):
        built(monkeypatch, off, strict=True)


def test_a_compile_that_works_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = built(monkeypatch, lambda module: module)
    assert engine.name == "compile" and engine.report.compile_fallback is None
    engine.close()
