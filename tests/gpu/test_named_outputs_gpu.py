"""Named outputs (model.toml's [[outputs]]) in CUDA graphs: each output packed inside the captured graph and
copied out once equals the same engine run eagerly on the GPU, and the model's own CPU output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from app.config import Settings
from app.engines.base import Engine
from app.engines.factory import build_engine, engine_options
from app.repository import load_model, read_repository
from tests.gpu.test_cuda_engine import run_rows
from tests.output_models import eager, images, write_repository

BUCKETS = (1, 4, 8)  # model.toml's buckets = [1, 4] win


def served(folder: Path, kind: str, engine: str, host_io: str, **settings: object) -> dict[str, np.ndarray]:
    """Each output of `kind` for 3 images (bucket 4, model.toml's largest: 1 padding row), from an engine on cuda:0."""
    (spec,) = [spec for spec in read_repository(folder) if spec.name == kind]
    model = load_model(spec)
    options = engine_options(Settings(device="cuda", buckets=BUCKETS, engine=engine, **settings), spec, ("cuda:0",))
    built: Engine = build_engine(model, options, in_flight=2, event_wait="poll", host_io=host_io)
    try:
        assert built.name == engine
        rows = asyncio.run(run_rows(built, built.slots[1], images(3, seed=3), 4))  # type: ignore[arg-type]
    finally:
        built.close()
    return model.spec.layout.cut(rows)


@pytest.mark.parametrize("host_io", ["auto", "copy"])
@pytest.mark.parametrize("compile", ["none", "inductor"])
@pytest.mark.parametrize("kind", ["embedder", "detector", "tagger"])
def test_graph_outputs_equal_eager_outputs(tmp_path: Path, kind: str, compile: str, host_io: str) -> None:
    write_repository(tmp_path, (kind,))
    graphs = served(tmp_path, kind, "cuda-graph", host_io, compile=compile)
    eager_gpu = served(tmp_path, kind, "eager", host_io)
    own = eager(kind, tmp_path, images(3, seed=3).astype(np.float32) / 255)  # the model on the CPU
    assert set(graphs) == set(eager_gpu) == set(own)
    for name, want in own.items():
        assert graphs[name].dtype == want.dtype and graphs[name].shape == want.shape, name
        if want.dtype.kind == "i":
            np.testing.assert_array_equal(graphs[name], eager_gpu[name], err_msg=name)
            np.testing.assert_array_equal(graphs[name], want, err_msg=name)
        else:
            np.testing.assert_allclose(graphs[name], eager_gpu[name], rtol=1e-5, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(graphs[name], want, rtol=1e-3, atol=1e-4, err_msg=name)
