"""Every torch format through the graph engine equals its own eager output; two models at once over HTTP."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from app.config import Settings
from app.engines.factory import build_engine, engine_options
from app.repository import load_model, read_repository
from models.fashion_mnist import load_test_sample
from tests import model_exports
from tests.gpu.test_cuda_engine import run_rows
from tests.integration.server_process import ROOT, running_server

EXAMPLES = ROOT / "models" / "examples" / "repository"


@pytest.mark.parametrize("export", ["torchscript", "exported", "python_factory"])
@pytest.mark.parametrize("compile", ["none", "inductor"])
def test_each_torch_format_in_graphs_equals_its_eager_output(tmp_path: Path, export: str, compile: str) -> None:
    getattr(model_exports, export)(tmp_path)
    (spec,) = read_repository(tmp_path)
    model = load_model(spec)
    options = engine_options(Settings(device="cuda", buckets=(1, 4, 32), compile=compile), spec, ("cuda:0",))
    reference = torch.jit.load(str(spec.path("model.pt"))) if export == "torchscript" else None
    engine = build_engine(model, options, in_flight=2, event_wait="poll")
    try:
        assert engine.name == "cuda-graph"
        images = load_test_sample()[0][:32].reshape(32, 1, 28, 28)
        got = asyncio.run(run_rows(engine, engine.slots[0], images, 32))
        module = reference if reference is not None else load_model(spec).module
        with torch.inference_mode():
            want = torch.softmax(module(torch.from_numpy(images.astype(np.float32) / 255)), dim=1).numpy()  # type: ignore[operator]
        np.testing.assert_allclose(got, want, atol=1e-4)
        assert max(engine.report.validation_error.values()) <= 1e-5
    finally:
        engine.close()


def test_resnet50_and_the_seed_cnn_served_at_once(tmp_path: Path) -> None:
    command = (sys.executable, "-m", "app.cli", "serve")
    settings = {"model_repository": str(EXAMPLES), "device": "cuda", "buckets": "1,8,32"}
    with running_server(tmp_path / "server.log", command=command, **settings) as url:
        listing = {card["name"]: card for card in httpx.get(f"{url}/v1/models").json()["models"]}
        assert set(listing) == {"fashion-cnn", "resnet50"}
        resnet = listing["resnet50"]
        assert resnet["engine"] == "cuda-graph" and resnet["dtype"] == "fp16" and resnet["random_weights"] is True
        assert max(resnet["validation_relative_error"].values()) <= 1e-2
        pixels = np.random.default_rng(0).integers(0, 256, (8, 3, 224, 224), dtype=np.uint8)
        raw = {"content-type": "application/octet-stream"}
        answer = httpx.post(f"{url}/v1/models/resnet50/predict", content=pixels.tobytes(), headers=raw, timeout=60)
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 8
        images = load_test_sample()[0][:8]
        seed = httpx.post(f"{url}/v1/models/fashion-cnn/predict", content=images.tobytes(), headers=raw)
        assert [p["label"] for p in seed.json()["predictions"]][:1] == [9]
