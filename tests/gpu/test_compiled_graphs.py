"""Inductor's kernels captured in our graphs (compile = inductor | max-autotune), on a real GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from app.batching.batcher import Batcher
from app.engines.cuda import TOLERANCE, CudaEngine
from app.engines.inductor import CAPTURE_MODES
from models.cnn import load_model
from tests.gpu.test_cuda_engine import DEVICE, assert_padding_never_changes_real_rows, eager, relative_error, run_rows
from tests.seed_model import seed_spec

BUCKETS = (1, 8, 64)


@pytest.fixture(scope="module", params=["inductor", "max-autotune"])
def compiled(request: pytest.FixtureRequest) -> Iterator[CudaEngine]:
    engine = CudaEngine(
        load_model(), seed_spec(), BUCKETS, device=DEVICE, torch_compile_mode=CAPTURE_MODES[request.param]
    )
    yield engine
    engine.close()


def test_compiled_graphs_equal_fp32_eager_at_every_bucket(compiled: CudaEngine) -> None:
    assert compiled.report.capture_seconds and max(compiled.report.validation_error.values()) <= TOLERANCE["fp32"]
    rng = np.random.default_rng(0)
    for bucket in BUCKETS:
        x = rng.random((bucket, 1, 28, 28), dtype=np.float32)
        got = asyncio.run(run_rows(compiled, compiled.slots[0], x, bucket))
        assert relative_error(got, eager(x)) <= TOLERANCE["fp32"], f"bucket {bucket}"


def test_compiled_padding_rows_never_change_real_rows(compiled: CudaEngine) -> None:
    assert_padding_never_changes_real_rows(compiled)


def test_compiled_serving_needs_no_global_synchronize(compiled: CudaEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a global synchronize was called on the serving path")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    rng = np.random.default_rng(2)
    inputs = [rng.integers(0, 256, (int(rng.integers(1, 70)), 1, 28, 28), dtype=np.uint8) for _ in range(100)]

    async def serve_all() -> list[np.ndarray]:
        batcher = Batcher(compiled, max_delay_s=0.0005, queue_limit=100_000, request_timeout_s=30)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(x) for x in inputs))
        finally:
            await batcher.stop()

    torch.cuda.set_sync_debug_mode("error")
    try:
        answers = asyncio.run(serve_all())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.undo()
    want = eager(np.concatenate(inputs).astype(np.float32) / 255)
    np.testing.assert_allclose(np.concatenate(answers), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_compiled_graphs_within_the_dtype_tolerance(dtype: str) -> None:
    engine = CudaEngine(
        load_model(), seed_spec(), BUCKETS, device=DEVICE, dtype=dtype, channels_last=True,
        torch_compile_mode=CAPTURE_MODES["inductor"],
    )  # fmt: skip
    try:
        assert max(engine.report.validation_error.values()) <= TOLERANCE[dtype]
    finally:
        engine.close()
