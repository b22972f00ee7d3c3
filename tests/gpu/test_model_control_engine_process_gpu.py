"""Model control through the engine process on a GPU (issue 27.2): two HTTP workers, the engine process
capturing each reload's CUDA graphs while it serves the other model; reloads under load answer every
request right from either worker, and an unload gives the device memory back — within 5 % of before,
read device-wide (the engine process is another process: torch's allocator figures here see nothing).
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from app.config import DEFAULT_REPOSITORY
from models.fashion_mnist import load_test_sample
from tests.integration.server_process import running_server

MODEL, OTHER = "fashion-cnn", "other-cnn"
RAW = {"content-type": "application/octet-stream"}
RELOADS = 10
SERVE = (sys.executable, "-m", "app.cli", "serve")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repository = tmp_path_factory.mktemp("control-ep-gpu")
    for name in (MODEL, OTHER):
        shutil.copytree(DEFAULT_REPOSITORY / MODEL, repository / name, ignore=shutil.ignore_patterns("*.json"))
    log = Path(tmp_path_factory.mktemp("control-ep-log")) / "server.log"
    settings = {
        "model_repository": str(repository), "device": "cuda", "engine": "cuda-graph", "compile": "none",
        "buckets": "1,2,4,8,16,32", "model_control": "explicit", "request_timeout_s": "2",
        "workers": "2", "engine_process": "true",
    }  # fmt: skip
    with running_server(log, command=SERVE, **settings) as server_url:
        yield server_url


def device_used() -> int:
    free, total = torch.cuda.mem_get_info()  # the whole device's, every process's
    return int(total - free)


def test_reloads_under_load_through_the_engine_process_answer_every_request_right(url: str) -> None:
    images = load_test_sample()[0][:4]  # (4, 28, 28) uint8
    want = [p["label"] for p in httpx.post(f"{url}/v1/models/{MODEL}/predict", content=images.tobytes(),
                                          headers=RAW).json()["predictions"]]  # fmt: skip
    stop, answers, wrong = threading.Event(), [0], []

    def send(model: str) -> None:
        with httpx.Client(timeout=30) as http:  # a connection each: the two workers share them
            while not stop.is_set():
                answer = http.post(f"{url}/v1/models/{model}/predict", content=images.tobytes(), headers=RAW)
                if answer.status_code != 200 or [p["label"] for p in answer.json()["predictions"]] != want:
                    wrong.append((model, answer.status_code, answer.text[:200]))
                answers[0] += 1

    threads = [threading.Thread(target=send, args=(name,), daemon=True) for name in (MODEL, MODEL, OTHER, OTHER)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(RELOADS):
            answer = httpx.post(f"{url}/v2/repository/models/{MODEL}/load", timeout=120)
            assert answer.status_code == 200, answer.text
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not wrong, wrong[:5]
    assert answers[0] > 100


def test_an_unload_through_the_engine_process_gives_the_device_memory_back(url: str) -> None:
    assert httpx.post(f"{url}/v2/repository/models/{MODEL}/unload", timeout=120).status_code == 200
    before = device_used()
    assert httpx.post(f"{url}/v2/repository/models/{MODEL}/load", timeout=120).status_code == 200
    loaded = device_used()
    assert httpx.post(f"{url}/v2/repository/models/{MODEL}/unload", timeout=120).status_code == 200
    after = before
    for _ in range(20):  # freed once retired: request_timeout_s after the switch, then its engines closed
        after = device_used()
        if after <= before * 1.05:
            break
        threading.Event().wait(0.5)
    print(f"device memory used: {before / 2**20:.0f} MiB, loaded {loaded / 2**20:.0f}, unloaded {after / 2**20:.0f}")
    assert after <= before * 1.05 + 2**20, (before, loaded, after)
    assert httpx.post(f"{url}/v2/repository/models/{MODEL}/load", timeout=120).status_code == 200
