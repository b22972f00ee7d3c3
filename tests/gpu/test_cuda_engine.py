"""The CUDA-graph engine on a real GPU (marker `gpu`; skipped where torch sees no CUDA device)."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import torch
from fastapi.testclient import TestClient

from app.batching.batcher import Batcher
from app.config import Settings
from app.engines.base import InputDtype, Slot
from app.engines.cuda import TOLERANCE, CudaEngine
from app.main import create_app
from models.cnn import load_model
from models.fashion_mnist import load_test_sample
from tests.integration.server_process import ROOT, running_server
from tests.seed_model import seed_spec

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
DEVICE = torch.device("cuda:0")


def build(**options: object) -> CudaEngine:
    buckets = options.pop("buckets", BUCKETS)
    return CudaEngine(load_model(), seed_spec(), buckets, device=DEVICE, **options)  # type: ignore[arg-type]


def eager(x: np.ndarray) -> np.ndarray:
    """(k, 1, 28, 28) → (k, 10) probabilities: the fp32 model run eagerly on the GPU, without TF32."""
    module = load_model(device=DEVICE)  # from models/ alone, independent of the service's model spec
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return torch.softmax(module(torch.from_numpy(x).to(DEVICE)), dim=1).cpu().numpy()


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


async def run_rows(engine: CudaEngine, slot: Slot, x: np.ndarray, bucket: int) -> np.ndarray:
    dtype: InputDtype = "uint8" if x.dtype == np.uint8 else "float32"
    slot.inputs[dtype][: len(x)] = x
    await engine.run(slot, bucket, dtype)
    return slot.outputs[: len(x)].copy()


@pytest.fixture
def engine() -> Iterator[CudaEngine]:
    built = build()
    yield built
    built.close()


@pytest.mark.parametrize("event_wait", ["poll", "spin", "block"])
def test_every_bucket_equals_eager_in_fp32(event_wait: str) -> None:
    engine = build(event_wait=event_wait)
    slot = engine.slots[0]
    rng = np.random.default_rng()
    try:
        for bucket in BUCKETS:
            x = rng.random((bucket, 1, 28, 28), dtype=np.float32)
            got = asyncio.run(run_rows(engine, slot, x, bucket))
            assert relative_error(got, eager(x)) <= TOLERANCE["fp32"], f"bucket {bucket}"
    finally:
        engine.close()


@pytest.mark.parametrize("compile_mode", [None, "default"])
def test_mapped_host_io_aliases_the_slots_and_equals_eager(compile_mode: str | None) -> None:
    """host_io "mapped": no memcpy nodes; the kernels read and write the pinned slot in place."""
    engine = build(host_io="mapped", torch_compile_mode=compile_mode, buckets=(1, 8, 32))
    rng = np.random.default_rng()
    try:
        assert engine.host_io == "mapped", "the device views fell back to copies"
        for slot in engine.slots:
            for bucket in (1, 8, 32):
                pixels = rng.integers(0, 256, (bucket, 1, 28, 28), dtype=np.uint8)
                got = asyncio.run(run_rows(engine, slot, pixels, bucket))
                want = eager(pixels.astype(np.float32) / np.float32(255))
                assert relative_error(got, want) <= 1e-4, f"slot {slot.index}, bucket {bucket}"
    finally:
        engine.close()


def test_launcher_slots_hold_and_capture_uint8_pixels_alone() -> None:
    """The front door's launcher hands its slots uint8 pixels only: no fp32 rows pinned or graphs captured for them,
    while the batcher's slots keep both; each launcher graph is handed out, slot by bucket."""
    engine = build(buckets=(1, 8, 32), launcher_slots=3)
    try:
        handles = engine.launcher_handles()
        assert handles is not None
        assert len(handles.ins) == len(handles.outs) == 3 and len(handles.graphs) == 3 * 3
        for state in engine._launcher_slots:
            assert list(state.host_in) == ["uint8"]
            assert sorted(state.graphs) == [(1, "uint8"), (8, "uint8"), (32, "uint8")]
        for slot in engine.slots:  # the batcher's
            assert set(slot.inputs) == {"uint8", "float32"}
    finally:
        engine.close()


def test_a_bucket_beyond_tolerance_stops_start_up_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TOLERANCE, "fp32", -1.0)  # nothing can pass: every bucket mismatches
    with pytest.raises(RuntimeError, match=r"\(fp32\) logits differ from fp32 eager beyond -1.*try another dtype"):
        build(buckets=(1, 8))


@pytest.mark.parametrize(("dtype", "channels_last"), [("fp16", False), ("bf16", False), ("fp16", True), ("fp32", True)])
def test_every_bucket_within_tolerance_at_each_dtype(dtype: str, channels_last: bool) -> None:
    engine = build(dtype=dtype, channels_last=channels_last)
    try:
        # Logits of every (slot, bucket) against fp32 eager on fresh random input, on each call.
        for _ in range(3):
            errors = engine._validate()
            assert max(errors.values()) <= TOLERANCE[dtype]
        # Probabilities of real images through the full path: same labels as fp32 eager.
        images, _ = load_test_sample()
        x = (images[:128].astype(np.float32) / 255).reshape(-1, 1, 28, 28)
        got = asyncio.run(run_rows(engine, engine.slots[1], x, 128))
        want = eager(x)
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.99
        assert np.abs(got - want).max() <= 0.05
    finally:
        engine.close()


def test_padding_rows_never_change_real_rows(engine: CudaEngine) -> None:
    assert_padding_never_changes_real_rows(engine)


def assert_padding_never_changes_real_rows(engine: CudaEngine) -> None:
    slot = engine.slots[0]
    rng = np.random.default_rng(1)
    real = rng.random((3, 1, 28, 28), dtype=np.float32)
    outputs = []
    for padding in (np.zeros((5, 1, 28, 28), np.float32), rng.random((5, 1, 28, 28), dtype=np.float32)):
        slot.inputs["float32"][3:8] = padding
        outputs.append(asyncio.run(run_rows(engine, slot, real, 8)))
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_serving_needs_no_global_synchronize(engine: CudaEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a global synchronize was called on the serving path")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", forbidden)
    torch.cuda.set_sync_debug_mode("error")  # and any implicit synchronizing call raises inside torch
    rng = np.random.default_rng(2)
    inputs = [rng.random((int(rng.integers(1, 40)), 1, 28, 28), dtype=np.float32) for _ in range(300)]

    async def serve_all() -> list[np.ndarray]:
        batcher = Batcher(engine, max_delay_s=0.0005, queue_limit=100_000, request_timeout_s=30)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(x) for x in inputs))
        finally:
            await batcher.stop()

    try:
        answers = asyncio.run(serve_all())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.undo()
    want = eager(np.concatenate(inputs))
    np.testing.assert_allclose(np.concatenate(answers), want, rtol=1e-4, atol=1e-6)


def test_replays_run_on_the_dedicated_stream_not_the_default_one(engine: CudaEngine) -> None:
    assert engine._stream.cuda_stream != torch.cuda.default_stream(DEVICE).cuda_stream
    slot = engine.slots[0]
    x = np.random.default_rng(3).random((4, 1, 28, 28), dtype=np.float32)
    with torch.cuda.stream(torch.cuda.default_stream(DEVICE)):
        torch.cuda._sleep(4_000_000_000)  # ~2 s of busy default stream at H200 clocks
    got = asyncio.run(run_rows(engine, slot, x, 4))
    # The batch came back while the default stream was still busy: nothing waited on it.
    assert not torch.cuda.default_stream(DEVICE).query()
    torch.cuda.default_stream(DEVICE).synchronize()
    np.testing.assert_allclose(got, eager(x), rtol=1e-4, atol=1e-6)


def test_device_memory_does_not_grow_over_10000_requests(engine: CudaEngine) -> None:
    rng = np.random.default_rng(4)
    pool = [rng.random((int(rng.integers(1, 9)), 1, 28, 28), dtype=np.float32) for _ in range(64)]

    async def serve(count: int, batcher: Batcher) -> None:
        for start in range(0, count, 500):
            await asyncio.gather(*(batcher.submit(pool[i % 64]) for i in range(start, start + 500)))

    async def measure() -> tuple[tuple[int, int], tuple[int, int]]:
        batcher = Batcher(engine, max_delay_s=0.0005, queue_limit=100_000, request_timeout_s=30)
        batcher.start()
        try:
            await serve(1_000, batcher)  # warm: every bucket used, allocator settled
            before = (torch.cuda.memory_allocated(DEVICE), torch.cuda.memory_reserved(DEVICE))
            await serve(10_000, batcher)
            after = (torch.cuda.memory_allocated(DEVICE), torch.cuda.memory_reserved(DEVICE))
            return before, after
        finally:
            await batcher.stop()

    before, after = asyncio.run(measure())
    assert after == before, f"allocated/reserved grew from {before} to {after}"


def test_failing_replay_answers_500_and_readiness_reports_a_broken_device(monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(create_app(Settings(device="cuda"))) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        body = orjson.dumps({"instances": [[0.5] * 784]})
        headers = {"content-type": "application/json"}
        assert client.post("/predict", content=body, headers=headers).status_code == 200
        engine = client.app.state.service.models["fashion-cnn"].engines[0]  # type: ignore[attr-defined]

        def failing(*args: object) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")

        monkeypatch.setattr(engine, "_queue_batch", failing)
        answer = client.post("/predict", content=body, headers=headers)
        assert answer.status_code == 500 and "illegal memory access" in answer.json()["error"]["message"]
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "device is dead" in ready.json()["detail"]


@pytest.mark.parametrize("engine_process", [False, True], ids=["per-process", "engine-process"])
def test_2000_concurrent_http_requests_each_equal_eager_for_their_own_input(
    tmp_path: Path, engine_process: bool
) -> None:
    """engine-process: two HTTP workers hand every request to one engine process's graphs."""
    clients, per_client = 8, 250  # each client one connection per request: no waiting in httpx's pool
    # 2,000 sockets on each side; the server, a child, inherits the raised limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    rng = np.random.default_rng(5)
    inputs = [rng.random((int(rng.integers(1, 4)), 784), dtype=np.float32) for _ in range(clients * per_client)]
    bodies = [orjson.dumps({"instances": x}, option=orjson.OPT_SERIALIZE_NUMPY) for x in inputs]
    command = (sys.executable, "-m", "app.cli", "serve")
    design = {"workers": "2", "engine_process": "true"} if engine_process else {}
    with running_server(tmp_path / "server.log", command=command, device="cuda", **design) as url:

        async def one_client(share: list[bytes]) -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=len(share))
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
                headers = {"content-type": "application/json"}
                return await asyncio.gather(*(client.post("/predict", content=b, headers=headers) for b in share))

        async def send_all() -> list[httpx.Response]:
            shares = [bodies[i * per_client : (i + 1) * per_client] for i in range(clients)]
            answers = await asyncio.gather(*(one_client(share) for share in shares))
            return [answer for share in answers for answer in share]

        answers = asyncio.run(send_all())
        (card,) = httpx.get(f"{url}/v1/models").json()["models"]
    assert card["engine"] == "cuda-graph"
    want = eager(np.concatenate(inputs).reshape(-1, 1, 28, 28))
    got = []
    for answer in answers:
        assert answer.status_code == 200, answer.text
        got.extend(p["scores"] for p in answer.json()["predictions"])
    np.testing.assert_allclose(np.array(got, dtype=np.float32), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("host_io", ["copy", "auto"])
def test_debug_dump_writes_the_graph_with_its_kernels(tmp_path: Path, host_io: str) -> None:
    out = tmp_path / "bucket8.dot"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "debug-dump", "--bucket", "8", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "CGSERVE_HOST_IO": host_io},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    kernels = re.findall(r"KERNEL", text, flags=re.IGNORECASE)
    assert kernels, text[:2000]
    # copy: the H2D/D2H copies are memcpy nodes of the graph; auto (the seed CNN's 784-byte rows):
    # the kernels read and write the pinned slot in place, a graph of kernels alone.
    assert bool(re.search(r"MEMCPY", text, flags=re.IGNORECASE)) == (host_io == "copy")


def test_uint8_pixels_equal_their_float_intensities_at_every_bucket(engine: CudaEngine) -> None:
    rng = np.random.default_rng(6)
    for bucket in BUCKETS:
        pixels = rng.integers(0, 256, (bucket, 1, 28, 28), dtype=np.uint8)
        from_pixels = asyncio.run(run_rows(engine, engine.slots[0], pixels, bucket))
        from_floats = asyncio.run(run_rows(engine, engine.slots[1], pixels.astype(np.float32) / 255, bucket))
        np.testing.assert_allclose(from_pixels, from_floats, rtol=1e-5, atol=1e-7)
