"""Several models behind one front door, in the real server process: a repository of the seed CNN, a twin of it
under another name (the same images, 1×28×28) and a model of other images (3×16×16). The door serves each model that
takes its images, v2 and gRPC, every answer the service's own ports' for that model; the others it refuses as the
ports refuse an unknown model, or saying where to send them; a bulk mixing the two models answers each request
from its own."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from models.fashion_mnist import load_test_sample
from tests.integration.server_process import ROOT, free_port, requests_counted, running_server, settled_metrics
from tests.integration.test_front_door import SERVE, compiler, read_answers
from tests.output_models import write_repository

__all__ = ["compiler"]  # the C compiler's check, for every test here too
TWIN = "fashion-twin"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("front-door-models")
    repository = write_repository(folder / "repository", ("embedder",))  # (3, 16, 16) images
    for name in ("fashion-cnn", TWIN):
        shutil.copytree(ROOT / "models" / "repository" / "fashion-cnn", repository / name)
    door_port, door_grpc_port, grpc_port = free_port(), free_port(), free_port()
    settings = {
        "device": "cpu",
        "model_repository": str(repository),
        "default_model": "fashion-cnn",
        "front_door_port": str(door_port),
        "front_door_grpc_port": str(door_grpc_port),
        "grpc_port": str(grpc_port),
        "front_door_threads": "2",
        "log_level": "debug",
    }
    with running_server(folder / "server.log", SERVE, **settings) as url:
        yield {"url": url, "door": f"127.0.0.1:{door_port}", "door_grpc": f"127.0.0.1:{door_grpc_port}",
               "grpc": f"127.0.0.1:{grpc_port}"}  # fmt: skip


def image(i: int = 0) -> np.ndarray:
    return load_test_sample()[0][i : i + 1].reshape(1, 1, 28, 28)  # uint8 pixels


def http_infer(address: str, model: str, pixels: np.ndarray, version: str = "") -> triton_http.InferResult:
    with triton_http.InferenceServerClient(address) as client:
        tensor = triton_http.InferInput("input", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels, binary_data=True)
        return client.infer(model, [tensor], model_version=version, request_id="r-1")


def grpc_infer(address: str, model: str, pixels: np.ndarray, version: str = "") -> triton_grpc.InferResult:
    with triton_grpc.InferenceServerClient(address) as client:
        tensor = triton_grpc.InferInput("input", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        return client.infer(model, [tensor], model_version=version, request_id="r-1")


def test_each_model_that_takes_the_doors_images_gets_the_ports_answers_there(server: dict[str, Any]) -> None:
    """Both models of the door's images, by name and by name and version, over v2 HTTP and gRPC: the door's answer
    is the port's for that model; so are each one's metadata, configuration and readiness; the twin's requests
    counted under its own name."""
    port = server["url"].removeprefix("http://")
    counted = {form: f'model="{TWIN}",protocol="door",format="{form}",code="200"' for form in ("v2-binary", "grpc")}
    before = settled_metrics(server["url"])  # the module's server: other tests' requests are counted too
    for model in ("fashion-cnn", TWIN):
        for version in ("", "1"):
            mine, theirs = (http_infer(address, model, image(), version) for address in (server["door"], port))
            assert mine.get_response() == theirs.get_response() and mine.get_response()["model_name"] == model
            np.testing.assert_array_equal(mine.as_numpy("probabilities"), theirs.as_numpy("probabilities"))
            calls = (grpc_infer(address, model, image(), version) for address in (server["door_grpc"], server["grpc"]))
            mine_grpc, theirs_grpc = calls
            assert mine_grpc.get_response() == theirs_grpc.get_response()
            assert mine_grpc.get_response().model_name == model
        for version in ("", "1"):  # by name, and by name and version (perf_analyzer's -x)
            with triton_http.InferenceServerClient(server["door"]) as door, \
                 triton_http.InferenceServerClient(port) as it:  # fmt: skip
                for call in ("get_model_metadata", "get_model_config", "is_model_ready"):
                    assert getattr(door, call)(model, version) == getattr(it, call)(model, version), (model, call)
            with triton_grpc.InferenceServerClient(server["door_grpc"]) as door, \
                 triton_grpc.InferenceServerClient(server["grpc"]) as it:  # fmt: skip
                for call in ("get_model_metadata", "get_model_config", "is_model_ready"):
                    assert getattr(door, call)(model, version) == getattr(it, call)(model, version), (model, call)
    after = settled_metrics(server["url"])
    for labels in counted.values():
        assert requests_counted(after, labels) - requests_counted(before, labels) == 2, labels


def test_models_the_door_does_not_serve_are_refused_as_the_port_refuses_them(server: dict[str, Any]) -> None:
    """An unknown model: the port's 404 (v2) and NOT_FOUND (gRPC), word for word. The model of other images, with
    its own images: the door's 400 saying which bytes it takes; sent the door's (a header that says 1×28×28): a 400
    that names the model's images and where to send them; gRPC's INVALID_ARGUMENT likewise. The door goes on."""
    port = server["url"].removeprefix("http://")
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8",
                                       "parameters": {"binary_data_size": 784}}]})  # fmt: skip
    head = {"inference-header-content-length": str(len(header))}
    with httpx.Client() as client:
        mine = client.post(f"http://{server['door']}/v2/models/nothing/infer", content=header + image().tobytes(),
                           headers=head)  # fmt: skip
        theirs = client.post(f"{server['url']}/v2/models/nothing/infer", content=header + image().tobytes(),
                             headers=head)  # fmt: skip
        assert mine.status_code == theirs.status_code == 404 and mine.json() == theirs.json()
        shaped = client.post(f"http://{server['door']}/v2/models/embedder/infer", content=header + image().tobytes(),
                             headers=head)  # fmt: skip
        assert shaped.status_code == 400
        assert "(3, 16, 16)" in shaped.json()["error"] and "service's ports" in shaped.json()["error"]
    own = np.zeros((1, 3, 16, 16), np.uint8)
    with pytest.raises(InferenceServerException, match="784 bytes") as refused:
        http_infer(server["door"], "embedder", own)
    assert refused.value.status() == "400"
    for address in (server["door_grpc"], server["grpc"]):
        with pytest.raises(InferenceServerException) as unknown:
            grpc_infer(address, "nothing", image())
        assert unknown.value.status() == "StatusCode.NOT_FOUND"
        if address == server["door_grpc"]:
            door_unknown = unknown.value.message()
    assert door_unknown == unknown.value.message()
    with pytest.raises(InferenceServerException, match=r"\(3, 16, 16\)") as refused:
        grpc_infer(server["door_grpc"], "embedder", image())
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert http_infer(port, "embedder", own).as_numpy("embedding").shape == (1, 512)  # the port serves it
    # Its readiness is the service's, at the door too: the door answers a model it has not been given "not ready".
    with triton_grpc.InferenceServerClient(server["door_grpc"]) as door:
        assert door.is_model_ready("embedder") and door.is_model_ready("embedder", "1")
        assert not door.is_model_ready("nothing")
    assert http_infer(server["door"], TWIN, image()).get_response()["model_name"] == TWIN


def test_a_bulk_of_both_models_answers_each_request_from_its_own(server: dict[str, Any]) -> None:
    """Forty v2 requests on eight connections, sent at once and alternating the two models (and a version path):
    they share bulks, and each answer names the model its request asked for, with that image's scores."""
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8",
                                       "parameters": {"binary_data_size": 784}}]})  # fmt: skip
    images = load_test_sample()[0][:40]
    paths = [f"/v2/models/{model}/infer" for model in ("fashion-cnn", TWIN, f"{TWIN}/versions/1")]
    host, port = server["door"].split(":")
    connections = [socket.create_connection((host, int(port))) for _ in range(8)]
    asked: list[list[tuple[str, int]]] = [[] for _ in connections]
    for i, pixels in enumerate(images):
        path = paths[i % 3]
        body = header + pixels.tobytes()
        request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {len(header)}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
        connections[i % 8].sendall(request)
        asked[i % 8].append((path.split("/")[3], i))
    expected = {}  # each image's scores from the service's port (the twin is the seed CNN under another name)
    with triton_http.InferenceServerClient(server["url"].removeprefix("http://")) as it:
        for i in range(len(images)):
            tensor = triton_http.InferInput("input", [1, 1, 28, 28], "UINT8")
            tensor.set_data_from_numpy(images[i].reshape(1, 1, 28, 28), binary_data=True)
            expected[i] = it.infer("fashion-cnn", [tensor]).as_numpy("probabilities")[0]
    for connection, wanted in zip(connections, asked, strict=True):
        for (status, _, body), (model, i) in zip(read_answers(connection, len(wanted)), wanted, strict=True):
            assert status.startswith(b"HTTP/1.1 200"), body
            answer = orjson.loads(body)
            assert answer["model_name"] == model
            np.testing.assert_allclose(answer["outputs"][0]["data"], expected[i], rtol=1e-5, atol=1e-7)
        connection.close()


def test_a_model_unloaded_and_loaded_again_under_door_traffic_answers_200_or_404(tmp_path: Path) -> None:
    """Door traffic for the twin (v2 HTTP on four connections, gRPC on one) while model control unloads and loads it
    four times, and for the default model beside it: each of the twin's requests is answered, 200 or the port's
    404 / NOT_FOUND, never a 500 or a hang; the default model's are all 200; loaded again, the twin answers."""
    repository = tmp_path / "repository"
    for name in ("fashion-cnn", TWIN):
        shutil.copytree(ROOT / "models" / "repository" / "fashion-cnn", repository / name)
    door_port, door_grpc_port = free_port(), free_port()
    settings = {"device": "cpu", "model_repository": str(repository), "default_model": "fashion-cnn",
                "front_door_port": str(door_port), "front_door_grpc_port": str(door_grpc_port),
                "front_door_threads": "2", "model_control": "explicit"}  # fmt: skip
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8",
                                       "parameters": {"binary_data_size": 784}}]})  # fmt: skip
    body, head = header + image().tobytes(), {"inference-header-content-length": str(len(header))}
    answered: Counter[tuple[str, str]] = Counter()
    errors: list[str] = []  # a sender's own failure (a timeout, a dropped connection): the test fails on any
    lock, stop = threading.Lock(), threading.Event()

    def count(key: tuple[str, str]) -> None:
        with lock:
            answered[key] += 1

    def sending(send: Callable[[], None]) -> None:
        try:
            while not stop.is_set():
                send()
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(f"{type(error).__name__}: {error}")

    def over_http(model: str) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{door_port}", timeout=10) as client:
            sending(lambda: count((model, str(client.post(f"/v2/models/{model}/infer", content=body,
                                                                headers=head).status_code))))  # fmt: skip

    def over_grpc() -> None:
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{door_grpc_port}") as client:
            tensor = triton_grpc.InferInput("input", [1, 1, 28, 28], "UINT8")
            tensor.set_data_from_numpy(image())

            def once() -> None:
                try:
                    client.infer(TWIN, [tensor], client_timeout=10)
                    count(("grpc", "OK"))
                except InferenceServerException as refused:  # a status the server sent; a timeout is not one
                    if refused.status() == "StatusCode.DEADLINE_EXCEEDED":
                        raise
                    count(("grpc", str(refused.status())))

            sending(once)

    with running_server(tmp_path / "server.log", SERVE, **settings) as url:
        senders = [threading.Thread(target=over_http, args=(TWIN,)) for _ in range(4)]
        senders += [threading.Thread(target=over_http, args=("fashion-cnn",)) for _ in range(2)]
        senders.append(threading.Thread(target=over_grpc))
        for sender in senders:
            sender.start()
        try:
            with triton_http.InferenceServerClient(url.removeprefix("http://")) as port:
                for _ in range(4):
                    time.sleep(0.3)
                    port.unload_model(TWIN)
                    time.sleep(0.3)
                    port.load_model(TWIN)
                time.sleep(0.3)
        finally:
            stop.set()
            for sender in senders:
                sender.join(timeout=30)
        assert not any(sender.is_alive() for sender in senders) and not errors, errors  # every request answered
        assert set(answered) <= {(TWIN, "200"), (TWIN, "404"), ("fashion-cnn", "200"),
                                 ("grpc", "OK"), ("grpc", "StatusCode.NOT_FOUND")}, answered  # fmt: skip
        assert all(answered[key] for key in ((TWIN, "200"), (TWIN, "404"), ("fashion-cnn", "200"), ("grpc", "OK"),
                                             ("grpc", "StatusCode.NOT_FOUND"))), answered  # fmt: skip
        assert http_infer(f"127.0.0.1:{door_port}", TWIN, image()).get_response()["model_name"] == TWIN
        assert httpx.get(f"{url}/readyz").status_code == 200
