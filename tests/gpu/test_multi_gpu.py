"""One model on two GPUs (marker `gpu`; skipped unless torch sees at least two CUDA devices).

The seed CNN, built as the service builds it: one copy of the module per GPU, inductor's kernels
compiled per GPU and captured in each GPU's graphs. Each GPU's answers must equal eager, both
GPUs must get batches under concurrent load, and the same must hold over HTTP with
CGSERVE_DEVICE=cuda:0,cuda:1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from app.batching.batcher import Batcher
from app.config import Settings
from app.engines.base import Engine
from app.engines.cuda import TOLERANCE, CudaEngine
from app.engines.factory import build_engine, engine_options, replica_of
from app.repository import load_model
from models.cnn import load_model as load_seed_cnn
from tests.integration.server_process import running_server
from tests.seed_model import seed_spec

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")

DEVICES = ("cuda:0", "cuda:1")
BUCKETS = (1, 8, 32)


def eager(x: np.ndarray, device: str = "cuda:0") -> np.ndarray:
    """(k, 1, 28, 28) float32 → (k, 10) probabilities: the fp32 model run eagerly, without TF32."""
    module = load_seed_cnn(device=torch.device(device))
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return torch.softmax(module(torch.from_numpy(x).to(device)), dim=1).cpu().numpy()


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Engine]]:
    """The seed CNN on both GPUs, built one after the other as app/service.py does."""
    settings = Settings(device=",".join(DEVICES), buckets=BUCKETS, compile="inductor")
    spec = seed_spec()
    model = load_model(spec)
    options = engine_options(settings, spec, DEVICES)
    built = [
        build_engine(
            model if i == len(DEVICES) - 1 else replica_of(model), options, device=d, in_flight=2, event_wait="poll"
        )
        for i, d in enumerate(DEVICES)
    ]
    yield built
    for engine in built:
        engine.close()


def test_each_engine_keeps_its_module_on_its_own_gpu(engines: list[Engine]) -> None:
    for engine, device in zip(engines, DEVICES, strict=True):
        assert isinstance(engine, CudaEngine) and engine.device == device
        # Building cuda:1's engine must not have moved cuda:0's module (its graphs read those weights).
        assert {str(p.device) for p in engine._module.parameters()} == {device}


@pytest.mark.parametrize("index", [0, 1])
def test_every_bucket_on_each_gpu_equals_eager(engines: list[Engine], index: int) -> None:
    engine = engines[index]
    rng = np.random.default_rng(index)

    async def run_all() -> list[tuple[np.ndarray, np.ndarray]]:
        checked = []
        for slot in engine.slots:
            for bucket in BUCKETS:
                x = rng.random((bucket, 1, 28, 28), dtype=np.float32)
                slot.inputs["float32"][:bucket] = x
                await engine.run(slot, bucket, "float32")
                checked.append((x, slot.outputs[:bucket].copy()))
        return checked

    for x, got in asyncio.run(run_all()):
        want = eager(x, DEVICES[index])
        error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert error <= TOLERANCE["fp32"], f"{engine.device} bucket {len(x)}: relative error {error:.2e}"


def test_both_gpus_get_batches_under_concurrent_load_and_every_answer_is_its_own(engines: list[Engine]) -> None:
    rng = np.random.default_rng(7)
    inputs = [rng.random((int(rng.integers(1, 9)), 1, 28, 28), dtype=np.float32) for _ in range(2_000)]

    async def serve() -> tuple[list[np.ndarray], list[int]]:
        batcher = Batcher(engines, max_delay_s=0.0005, queue_limit=100_000, request_timeout_s=60)
        batcher.start()
        try:
            results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(x) for x in inputs)), timeout=120)
            return results, list(batcher.pool.launched)
        finally:
            await batcher.stop()

    results, launched = asyncio.run(serve())
    assert all(n > 0 for n in launched), f"batches per GPU: {launched}"
    np.testing.assert_allclose(np.concatenate(results), eager(np.concatenate(inputs)), rtol=1e-4, atol=1e-6)


def test_served_over_http_on_two_gpus(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    inputs = [rng.random((int(rng.integers(1, 5)), 784), dtype=np.float32) for _ in range(400)]
    bodies = [orjson.dumps({"instances": x}, option=orjson.OPT_SERIALIZE_NUMPY) for x in inputs]
    command = (sys.executable, "-m", "app.cli", "serve")  # this interpreter: the GPU machine's torch, not make's venv
    with running_server(tmp_path / "server.log", command=command, device="cuda:0,cuda:1", buckets="1,8,32") as url:

        async def send_all() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
                headers = {"content-type": "application/json"}
                return await asyncio.gather(*(client.post("/predict", content=b, headers=headers) for b in bodies))

        answers = asyncio.run(send_all())
        card = httpx.get(f"{url}/v1/models/fashion-cnn").json()
        readiness = httpx.get(f"{url}/readyz")
        exposition = httpx.get(f"{url}/metrics").text
    assert readiness.status_code == 200
    launched_by_metric = {
        sample.labels["device"]: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "cgserve_device_batches_total" and sample.labels["model"] == "fashion-cnn"
    }
    assert card["device"] == "cuda:0,cuda:1" and set(card["devices"]) == set(DEVICES)
    for device in DEVICES:
        assert card["devices"][device]["state"] == "ready"
        assert card["devices"][device]["batches_launched"] > 0, card["devices"]
        assert launched_by_metric[device] > 0, launched_by_metric
    got = []
    for answer in answers:
        assert answer.status_code == 200, answer.text
        got.extend(p["scores"] for p in answer.json()["predictions"])
    want = eager(np.concatenate(inputs).reshape(-1, 1, 28, 28))
    np.testing.assert_allclose(np.array(got, dtype=np.float32), want, rtol=1e-4, atol=1e-6)
