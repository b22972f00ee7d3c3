"""A capture on a device never breaks launches on it (issue 23.1), on a real GPU.

Model A serves from an event-loop thread while model B's graphs are captured on this thread,
as the service does at start-up (each model ready on its own) and as a model load would. With
torch.cuda.graph's default "global" capture mode A's event queries and replays failed with
cudaErrorStreamCaptureUnsupported and its device was declared dead; `serve_while_capturing`
runs either mode, in its own process for "global" (a failed capture can leave the context
unusable for the tests after it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from app.batching.batcher import Batcher
from app.engines import graph_capture
from app.engines.cuda import CudaEngine
from loadtest.server_process import HOST, free_port, running
from models.cnn import load_model
from tests.gpu.test_cuda_engine import DEVICE, eager
from tests.integration.server_process import ROOT
from tests.seed_model import seed_spec

CLIENTS = 16


def serve_while_capturing(
    mode: str, capture_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
) -> dict[str, Any]:
    """Model A answers CLIENTS concurrent streams of requests while B is built and captured in `mode`."""
    graph_capture.CAPTURE_ERROR_MODE = mode
    serving = CudaEngine(load_model(), seed_spec(), (1, 8, 64), device=DEVICE)
    loop = asyncio.new_event_loop()
    stop = threading.Event()
    answered, errors, wrong = [0], [], [0]
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 256, (int(rng.integers(1, 9)), 1, 28, 28), dtype=np.uint8) for _ in range(64)]
    wants = [eager(x.astype(np.float32) / 255) for x in inputs]

    async def client(batcher: Batcher, index: int) -> None:
        while not stop.is_set():
            x, want = inputs[index % len(inputs)], wants[index % len(wants)]
            index += CLIENTS
            try:
                got = await batcher.submit(x)
            except Exception as error:  # the batch failed: what the service would answer 500 / die of
                errors.append(f"{type(error).__name__}: {error}")
                return
            answered[0] += 1
            wrong[0] += int(not np.allclose(got, want, rtol=1e-4, atol=1e-6))

    async def serve(started: threading.Event) -> None:
        batcher = Batcher(serving, max_delay_s=0.0002, queue_limit=100_000, request_timeout_s=60)
        batcher.start()
        started.set()
        await asyncio.gather(*(client(batcher, i) for i in range(CLIENTS)))
        await batcher.stop()

    started = threading.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(serve(started)), name="serving")
    thread.start()
    started.wait()
    while answered[0] < 100 and thread.is_alive():  # A is serving before B starts
        time.sleep(0.01)
    before = answered[0]
    t0 = time.perf_counter()
    build_error = None
    try:
        captured = CudaEngine(load_model(), seed_spec(), capture_buckets, device=DEVICE)
        captured.close()
    except Exception as error:
        build_error = f"{type(error).__name__}: {error}"
    build_seconds = time.perf_counter() - t0
    during = answered[0] - before
    stop.set()
    thread.join(timeout=60)
    serving.close()
    return {
        "capture_error_mode": mode,
        "captures": 2 * 2 * len(capture_buckets),  # slots × input dtypes × buckets
        "build_seconds": round(build_seconds, 3),
        "answered_while_capturing": during,
        "wrong_answers": wrong[0],
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "serving_engine_healthy": serving.healthy(),
        "second_engine_error": build_error,
    }


def test_a_model_serves_without_a_failed_batch_while_another_is_captured() -> None:
    result = serve_while_capturing("thread_local")
    assert result["errors"] == 0, result
    assert result["serving_engine_healthy"] and result["second_engine_error"] is None, result
    assert result["answered_while_capturing"] > 0 and result["wrong_answers"] == 0, result


def test_global_capture_mode_is_what_broke_it() -> None:
    """The control, in a process of its own: the same load with the old mode fails a batch."""
    code = (
        "import json, sys; from tests.gpu.test_capture_while_serving import serve_while_capturing; "
        "print(json.dumps(serve_while_capturing('global')))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:  # a context broken mid-capture can hang the process: broken too
        return
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"exit": done.returncode, "stderr": done.stderr[-2000:]}
    print(json.dumps(result))  # the record: bench/results keeps this run's output
    broke = result.get("errors", 1) > 0 or result.get("second_engine_error") or done.returncode != 0
    assert broke, f"global capture mode no longer breaks launches of other threads: {result}"


def write_model(folder: Path, *, compile: str, buckets: str) -> None:
    folder.mkdir(parents=True)
    weights = ROOT / "models" / "repository" / "fashion-cnn" / "fashion_cnn.pt"
    (folder / "fashion_cnn.pt").write_bytes(weights.read_bytes())
    labels = ", ".join(f'"c{i}"' for i in range(10))
    (folder / "model.toml").write_text(
        'format = "python"\nfactory = "models.cnn:FashionCNN"\nweights = "fashion_cnn.pt"\n'
        f'input_shape = [1, 28, 28]\nlabels = [{labels}]\ncompile = "{compile}"\nbuckets = "{buckets}"\n'
    )


def test_two_models_traffic_on_the_first_from_the_moment_it_is_ready(tmp_path: Path) -> None:
    """The service as a user starts it: the first model takes requests while the second compiles and captures."""
    repository = tmp_path / "repository"
    write_model(repository / "a-first", compile="none", buckets="1,8,64")
    write_model(repository / "b-second", compile="inductor", buckets="1,2,4,8,16,32,64,128")
    port = free_port()
    env = {
        "CGSERVE_HOST": HOST,
        "CGSERVE_PORT": str(port),
        "CGSERVE_GRPC_PORT": "0",
        "CGSERVE_MODEL_REPOSITORY": str(repository),
        "CGSERVE_COMPILE_CACHE_DIR": str(tmp_path / "inductor"),  # cold: the longest capture window
    }
    argv = (sys.executable, "-m", "app.cli", "serve")
    body = np.random.default_rng(1).integers(0, 256, (4, 1, 28, 28), dtype=np.uint8).tobytes()
    headers = {"content-type": "application/octet-stream"}  # 4 images of 784 uint8 pixels
    statuses: dict[int, int] = {}
    with running(argv, tmp_path / "server.log", port=port, env=env, ready_path="/v1/models/a-first/ready") as server:

        async def traffic() -> bool:
            async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
                whole_ready = False

                async def one_client() -> None:
                    nonlocal whole_ready
                    while not whole_ready:
                        answer = await client.post("/v1/models/a-first/predict", content=body, headers=headers)
                        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

                async def watch() -> None:
                    nonlocal whole_ready
                    while (await client.get("/readyz")).status_code != 200:
                        assert server.proc.poll() is None, "the server exited while the second model was captured"
                        await asyncio.sleep(0.2)
                    whole_ready = True

                await asyncio.gather(watch(), *(one_client() for _ in range(32)))
                return whole_ready

        assert asyncio.run(traffic())
        described = httpx.get(f"{server.url}/v1/models/b-second", trust_env=False).json()
        log = server.log_tail(200_000)
        assert server.proc.poll() is None
    assert set(statuses) == {200}, (statuses, log[-3000:])
    assert sum(statuses.values()) > 100
    assert "compile_fallback" not in json.dumps(described) and described["compile"] == "inductor", described
    assert "recompile_limit" not in log, log[-3000:]


def test_two_models_of_one_class_each_run_inductors_kernels_at_every_bucket() -> None:
    """Dynamo's recompile limit is per code object: two FashionCNNs with 8 buckets and two input dtypes each
    used to send buckets 8…1 of the uint8 path to the eager module, silently."""
    buckets = (1, 2, 4, 8, 16, 32, 64, 128)
    engines = [
        CudaEngine(load_model(), seed_spec(), buckets, device=DEVICE, torch_compile_mode="default") for _ in range(2)
    ]
    try:
        for engine in engines:
            assert engine.report.compile_fallback is None
            assert engine.report.facts["compiled_graphs"] >= len(buckets), engine.report.facts
    finally:
        for engine in engines:
            engine.close()


def test_a_limit_hit_is_said_not_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the old, per-call limit (buckets + 4), the engine now says it fell back; compile_strict refuses."""
    import torch._dynamo.config as dynamo_config

    from app.engines import inductor

    def old_limit(shapes: int) -> None:
        monkeypatch.setattr(dynamo_config, "recompile_limit", 3)
        monkeypatch.setattr(dynamo_config, "fail_on_recompile_limit_hit", True)
        monkeypatch.setattr(dynamo_config, "automatic_dynamic_shapes", False)

    monkeypatch.setattr(inductor, "allow_recompiles", old_limit)
    torch._dynamo.reset()
    buckets = (1, 2, 4, 8, 16)
    engine = CudaEngine(load_model(), seed_spec(), buckets, device=DEVICE, torch_compile_mode="default")
    try:
        assert engine.report.compile_fallback is not None and "Recompile" in engine.report.compile_fallback
        assert not engine.report.capture_seconds or set(engine.report.capture_seconds) == set(buckets)
    finally:
        engine.close()
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"(?i)recompile"):
        CudaEngine(load_model(), seed_spec(), buckets, device=DEVICE, torch_compile_mode="default", compile_strict=True)
    torch._dynamo.reset()


def test_a_failing_compiler_falls_back_to_graphs_of_the_eager_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing C toolchain or Python.h fails inductor at the first warm-up; a backend that raises stands in."""
    from app.engines import inductor

    def no_toolchain(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        raise RuntimeError("gcc: not found (stand-in for a missing C toolchain)")

    real_compile = torch.compile
    monkeypatch.setattr(
        inductor.torch, "compile", lambda module, **kw: real_compile(module, backend=no_toolchain, dynamic=False)
    )
    engine = CudaEngine(load_model(), seed_spec(), (1, 8), device=DEVICE, torch_compile_mode="default")
    try:
        assert engine.report.compile_fallback is not None and "gcc" in engine.report.compile_fallback
        assert max(engine.report.validation_error.values()) <= 1e-5  # the eager module's graphs, validated
    finally:
        engine.close()
    with pytest.raises(Exception, match="gcc"):
        CudaEngine(load_model(), seed_spec(), (1, 8), device=DEVICE, torch_compile_mode="default", compile_strict=True)
