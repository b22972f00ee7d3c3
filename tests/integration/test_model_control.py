"""Model control on a real server (CPU), in one process and through the engine process with two workers:
tritonclient's repository calls unchanged, and 20 reloads and some unloads under continuous load with
no request lost, failed or answered by a half-built model.

Every request gets exactly one answer. 200 with the right label whenever the model is loaded; 404
(no such model) only for a request that overlaps a deliberate unload (from the unload call's start
to the following load's end); never a 5xx or a connection error.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from app.config import DEFAULT_REPOSITORY
from models.fashion_mnist import load_test_sample
from tests.integration.server_process import free_port, running_server

MODEL = "fashion-cnn"
SERVE = (sys.executable, "-m", "app.cli", "serve")
RELOADS = 20
SENDERS = 3
RAW = {"content-type": "application/octet-stream"}


# One process holding its models; or two HTTP workers whose models the engine process builds, serves
# and frees, a call to either worker changing what both serve.
DESIGNS = {"one-process": {}, "engine-process": {"workers": "2", "engine_process": "true"}}


@pytest.fixture(scope="module", params=list(DESIGNS))
def design(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def repository(design: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(f"control-{design}") / "repository"
    shutil.copytree(DEFAULT_REPOSITORY / MODEL, folder / MODEL, ignore=shutil.ignore_patterns("*.json"))
    return folder


@pytest.fixture(scope="module")
def server(design: str, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("control-log") / "server.log"
    settings = {
        "device": "cpu",
        "grpc_port": str(grpc_port),
        "model_repository": str(repository),
        "model_control": "explicit",
        "request_timeout_s": "2",  # a retired version is freed 2 s after the switch at the latest
        "buckets": "1,2,4,8",
    } | DESIGNS[design]
    with running_server(log, command=SERVE, **settings) as url:
        yield {"url": url, "http": url.removeprefix("http://"), "grpc": f"127.0.0.1:{grpc_port}"}


def set_max_delay(repository: Path, max_delay_ms: float, postprocess: str = "softmax") -> None:
    """model.toml with this max_delay_ms and postprocess (softmax and sigmoid give the same labels, other
    scores: an answer says which model served it)."""
    toml = repository / MODEL / "model.toml"
    keys = ("max_delay_ms", "postprocess")
    lines = [line for line in toml.read_text().splitlines() if not line.startswith(keys)]
    head = [f"max_delay_ms = {max_delay_ms}", f'postprocess = "{postprocess}"']
    toml.write_text("\n".join([*head, *lines]) + "\n")


def test_tritonclient_index_load_and_unload_unchanged(server: dict[str, str]) -> None:
    for client in (
        triton_http.InferenceServerClient(server["http"]),
        triton_grpc.InferenceServerClient(server["grpc"]),
    ):
        index = client.get_model_repository_index()
        entries = index if isinstance(index, list) else [
            {"name": m.name, "version": m.version, "state": m.state} for m in index.models
        ]  # fmt: skip
        assert {"name": MODEL, "version": "1", "state": "READY"}.items() <= entries[0].items()
        client.unload_model(MODEL)
        assert not is_ready(client)
        index = client.get_model_repository_index()
        states = [e["state"] for e in index] if isinstance(index, list) else [m.state for m in index.models]
        assert "READY" not in states
        client.load_model(MODEL)
        assert is_ready(client)
        with pytest.raises(InferenceServerException, match="no model named 'nowhere'"):
            client.load_model("nowhere")
        assert is_ready(client)


def is_ready(client: triton_http.InferenceServerClient | triton_grpc.InferenceServerClient) -> bool:
    """Triton's clients poll is_model_ready around a load: False, not an error, for a model not served (HTTP: its
    404; gRPC: ready=false, as Triton answers, where NOT_FOUND raised in the client)."""
    return bool(client.is_model_ready(MODEL))


def test_a_failed_load_leaves_the_model_serving(server: dict[str, str], repository: Path) -> None:
    toml = repository / MODEL / "model.toml"
    good = toml.read_text()
    toml.write_text(good + "batch_size = 8\n")
    try:
        answer = httpx.post(f"{server['url']}/v2/repository/models/{MODEL}/load", timeout=60)
        assert answer.status_code == 400 and "batch_size: unknown key" in answer.json()["error"]
    finally:
        toml.write_text(good)
    assert httpx.get(f"{server['url']}/v2/models/{MODEL}/ready").status_code == 200


def test_a_load_into_an_emptied_repository_is_not_found(server: dict[str, str], repository: Path) -> None:
    """gRPC NOT_FOUND and HTTP 404 naming the model, as for any name the repository does not hold (it was
    INVALID_ARGUMENT and 400: the repository's "holds no model")."""
    aside = repository.parent / "aside"
    shutil.move(repository / MODEL, aside)
    try:
        with pytest.raises(InferenceServerException) as raised:
            triton_grpc.InferenceServerClient(server["grpc"]).load_model(MODEL)
        assert raised.value.status() == str(grpc.StatusCode.NOT_FOUND), raised.value
        assert f"no model named '{MODEL}'" in str(raised.value.message())
        answer = httpx.post(f"{server['url']}/v2/repository/models/{MODEL}/load", timeout=60)
        assert answer.status_code == 404 and f"no model named '{MODEL}'" in answer.json()["error"]
    finally:
        shutil.move(aside, repository / MODEL)
    assert httpx.get(f"{server['url']}/v2/models/{MODEL}/ready").status_code == 200  # what served still serves


class Sender(threading.Thread):
    """Sends one image at a time until told to stop; records (start, end, status, label) of each."""

    def __init__(self, url: str, image: bytes, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.image, self.stop = url, image, stop
        self.results: list[tuple[float, float, int, int | None]] = []
        self.errors: list[str] = []
        self.sent = 0

    def run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                self.sent += 1
                started = time.monotonic()
                try:
                    answer = http.post(f"{self.url}/v1/models/{MODEL}/predict", content=self.image, headers=RAW)
                except httpx.HTTPError as error:  # a lost request
                    self.errors.append(f"{type(error).__name__}: {error}")
                    continue
                label = answer.json()["predictions"][0]["label"] if answer.status_code == 200 else None
                self.results.append((started, time.monotonic(), answer.status_code, label))


def test_twenty_reloads_and_unloads_under_load_lose_nothing(server: dict[str, str], repository: Path) -> None:
    url = server["url"]
    image = load_test_sample()[0][:1].tobytes()  # one real 28×28 test image, uint8
    expected = httpx.post(f"{url}/v1/models/{MODEL}/predict", content=image, headers=RAW).json()
    label = expected["predictions"][0]["label"]
    stop = threading.Event()
    senders = [Sender(url, image, stop) for _ in range(SENDERS)]
    unloaded: list[tuple[float, float]] = []  # (unload call started, the following load returned)
    for sender in senders:
        sender.start()
    try:
        time.sleep(0.5)
        for reload in range(RELOADS):
            postprocess = ("softmax", "sigmoid")[reload % 2]
            set_max_delay(repository, [0.5, 2.0, 5.0][reload % 3], postprocess)  # a changed model.toml each time
            if reload % 7 == 3:  # now and then: unload first, then load
                began = time.monotonic()
                answer = httpx.post(f"{url}/v2/repository/models/{MODEL}/unload", timeout=60)
                assert answer.status_code == 200, answer.text
                time.sleep(0.2)
            answer = httpx.post(f"{url}/v2/repository/models/{MODEL}/load", timeout=60)
            assert answer.status_code == 200, answer.text
            if reload % 7 == 3:
                unloaded.append((began, time.monotonic()))
            card = httpx.get(f"{url}/v1/models/{MODEL}").json()
            assert card["batching"]["max_delay_ms"] == [0.5, 2.0, 5.0][reload % 3]  # the new model.toml serves
            for _ in range(4):  # new connections: with two workers, either may take each; both serve the new one
                answer = httpx.post(f"{url}/v1/models/{MODEL}/predict", content=image, headers=RAW)
                assert answer.json()["postprocess"] == postprocess, (reload, answer.text[:200])
            time.sleep(0.1)
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=60)
        set_max_delay(repository, 1.0)  # the module's other tests load softmax scores from this model.toml
    results = [result for sender in senders for result in sender.results]
    assert not [e for sender in senders for e in sender.errors], "requests lost"
    assert sum(sender.sent for sender in senders) == len(results)  # one answer each
    ok = [r for r in results if r[2] == 200]
    assert len(ok) > 100 and all(r[3] == label for r in ok), "a wrong answer"
    refused = [r for r in results if r[2] != 200]
    assert all(r[2] == 404 for r in refused), sorted({r[2] for r in refused})
    for started, ended, _, _ in refused:  # only while deliberately unloaded
        assert any(began <= ended and started <= loaded for began, loaded in unloaded), (started, ended)
    assert len(unloaded) == 3


def test_a_load_of_a_second_version_routes_by_version_over_grpc(server: dict[str, str], repository: Path) -> None:
    model = repository / MODEL
    for version in ("1", "2"):
        (model / version).mkdir()
        shutil.copy(model / "fashion_cnn.pt", model / version)
    (model / "fashion_cnn.pt").unlink()  # each version's weights in its folder now
    toml = model / "model.toml"
    toml.write_text("version_policy = { all = {} }\n" + toml.read_text())  # above its [preprocess] table
    assert httpx.post(f"{server['url']}/v2/repository/models/{MODEL}/load", timeout=60).status_code == 200
    triton = triton_grpc.InferenceServerClient(server["grpc"])
    images = load_test_sample()[0][:2].reshape(2, 1, 28, 28)
    tensor = triton_grpc.InferInput("input", [2, 1, 28, 28], "UINT8")
    tensor.set_data_from_numpy(images)
    for asked, answered in (("1", "1"), ("2", "2"), ("", "2")):
        result = triton.infer(MODEL, [tensor], model_version=asked)
        assert result.get_response().model_version == answered
        assert np.allclose(result.as_numpy("probabilities").sum(axis=1), 1, atol=1e-4)
    with pytest.raises(InferenceServerException) as raised:
        triton.infer(MODEL, [tensor], model_version="3")
    assert raised.value.status() == str(grpc.StatusCode.NOT_FOUND)
    assert triton.get_model_metadata(MODEL).versions == ["1", "2"]
    card = httpx.get(f"{server['url']}/v1/models/{MODEL}").json()
    assert card["version"] == "2" and set(card["versions"]) == {"1", "2"}


# A factory computing in torch until the test releases it (weights read and converted on a slow mount): its load is
# under way when the server is told to stop.
COMPUTING_MODEL = '''"""The seed CNN, built once the test says so, computing meanwhile."""
import time
from pathlib import Path

import torch

from models.cnn import FashionCNN

GATES = Path(__file__).resolve().parents[2]


def build() -> FashionCNN:
    (GATES / "building").touch()
    a, deadline = torch.randn(128, 128), time.monotonic() + 30
    while not (GATES / "released").exists() and time.monotonic() < deadline:
        a = torch.tanh(a @ a)
    return FashionCNN()
'''


@pytest.mark.parametrize(("design", "drain_s"), [("one-process", "0"), ("engine-process", "0.5")])
def test_a_load_under_way_at_sigterm_is_503_at_once_and_the_server_exits_without_waiting_for_it(
    design: str, drain_s: str, tmp_path: Path
) -> None:
    """The load's request was held through the shutdown timeout and cut with a 500 (with CGSERVE_DRAIN_SECONDS=0
    no drain began at all); the engine process waited for the factory, then aborted inside torch (reviews)."""
    import os
    import signal

    from loadtest.server_process import running

    repository = tmp_path / "gates" / "repository"
    shutil.copytree(DEFAULT_REPOSITORY / MODEL, repository / MODEL, ignore=shutil.ignore_patterns("*.json"))
    port, grpc_port = free_port(), free_port()
    env = {"CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": str(grpc_port),
           "CGSERVE_DEVICE": "cpu", "CGSERVE_MODEL_REPOSITORY": str(repository), "CGSERVE_MODEL_CONTROL": "explicit",
           "CGSERVE_DRAIN_SECONDS": drain_s, "CGSERVE_SHUTDOWN_TIMEOUT_S": "20"}  # fmt: skip
    env |= {f"CGSERVE_{k.upper()}": v for k, v in DESIGNS[design].items()}
    with running(SERVE, tmp_path / "server.log", port=port, env=env) as server:
        shutil.copytree(repository / MODEL, repository / "held")
        (repository / "held" / "model.py").write_text(COMPUTING_MODEL)
        toml = repository / "held" / "model.toml"
        toml.write_text(toml.read_text().replace('"models.cnn:FashionCNN"', '"model:build"'))
        answers: list[httpx.Response] = []
        loading = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{server.url}/v2/repository/models/held/load", timeout=60)))  # fmt: skip
        loading.start()
        deadline = time.monotonic() + 60
        while not (tmp_path / "gates" / "building").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            began = time.monotonic()
            os.kill(server.proc.pid, signal.SIGTERM)
            loading.join(timeout=30)
            answered = time.monotonic() - began
            server.proc.wait(timeout=30)
            exited = time.monotonic() - began
        finally:
            (tmp_path / "gates" / "released").touch()
        log = (tmp_path / "server.log").read_text()
    assert answers and answers[0].status_code == 503, (answers, log[-2000:])
    assert "the server began to stop before the load of 'held' ended" in answers[0].json()["error"]
    assert answered < 5 and exited < 15, (answered, exited)
    assert "terminate called" not in log and "Traceback" not in log, log[-3000:]
