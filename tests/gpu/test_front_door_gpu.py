"""The front door (app/front_door) on a real GPU: the seed CNN's CUDA graphs behind it, with one process, with the
engine process and with the launcher off; 64 connections' images at once (a third POST /predict, a third v2 binary
UINT8 as Triton's HTTP clients send it, a third gRPC ModelInfer with UINT8 raw contents, on the door's gRPC port)
each get their own image's scores, equal to the fp32 model run eagerly, and the bulks went through the graphs
(/metrics counts the door's answers). The launcher (POST /predict's rows launched and answered in C,
app/front_door/launch.c) answers as the service's port does. And two models behind one door (the seed CNN and its
twin, 32 connections over v2 HTTP and gRPC): each request answered by its own model's graphs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.gpu.test_cuda_engine import eager, relative_error
from tests.integration.door_toolchain import door_toolchain
from tests.integration.server_process import free_port, running_server, settled_metrics

pytestmark = pytest.mark.skipif(door_toolchain() is not None, reason="no C compiler or nghttp2 headers for the door")
SERVE = (sys.executable, "-m", "app.cli", "serve")
CONNECTIONS, EACH = 64, 8
V2_HEADER = orjson.dumps({
    "inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8",
                "parameters": {"binary_data_size": 784}}],
    "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
})  # fmt: skip


def v2_scores(client: httpx.Client, image: np.ndarray) -> list[float]:
    """One image through the v2 infer with the binary tensor extension, both ways."""
    answer = client.post("/v2/models/fashion-cnn/infer", content=V2_HEADER + image.tobytes(),
                         headers={"inference-header-content-length": str(len(V2_HEADER))})  # fmt: skip
    assert answer.status_code == 200, answer.text
    length = int(answer.headers["inference-header-content-length"])
    return np.frombuffer(answer.content[length:], np.float32).tolist()


def grpc_scores(channel: Any, image: np.ndarray) -> list[float]:
    """One image through the door's gRPC ModelInfer, as Triton's clients send it: a UINT8 input, raw contents."""
    # Here, not at the top: the protocol's messages share names with tritonclient's, which the CPU tests import.
    from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb

    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", pb.ModelInferRequest.SerializeToString,
                                pb.ModelInferResponse.FromString)  # fmt: skip
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    request = pb.ModelInferRequest(model_name="fashion-cnn", inputs=[tensor], raw_input_contents=[image.tobytes()])
    answer = infer(request, timeout=30)
    return np.frombuffer(answer.raw_output_contents[0], np.float32).tolist()


def at_once(one_connection: Callable[[int], list[list[float]]], connections: int, want: np.ndarray) -> np.ndarray:
    """Each of `connections` connections' answers at once (connection c sends images c, c + connections, …), put
    back in the images' order: (k, 10) scores, the shape of `want`."""
    with ThreadPoolExecutor(connections) as pool:
        together = list(pool.map(one_connection, range(connections)))
    got = np.empty_like(want)
    for first, answers in enumerate(together):
        got[first::connections] = answers
    return got


@pytest.fixture(params=["one process", "engine process", "launcher off"])
def door(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    port, grpc_port = free_port(), free_port()
    settings = {"device": "cuda", "engine": "cuda-graph", "compile": "none", "front_door_port": str(port),
                "front_door_grpc_port": str(grpc_port), "front_door_threads": "4"}  # fmt: skip
    if request.param == "engine process":
        settings |= {"workers": "2", "engine_process": "true"}
    settings["front_door_launcher"] = "false" if request.param == "launcher off" else "true"
    with running_server(tmp_path / "server.log", SERVE, **settings) as url:
        yield url, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def test_each_of_64_connections_gets_its_images_scores(door: tuple[str, str, str]) -> None:
    import grpc

    url, door_url, grpc_address = door
    images = np.random.default_rng(0).integers(0, 256, (CONNECTIONS * EACH, 1, 28, 28), dtype=np.uint8)
    want = eager(images.astype(np.float32) / 255)

    def one_connection(first: int) -> list[list[float]]:
        if first % 3 == 2:
            with grpc.insecure_channel(grpc_address) as channel:
                return [grpc_scores(channel, images[i]) for i in range(first, len(images), CONNECTIONS)]
        with httpx.Client(base_url=door_url, timeout=30) as client:
            answers = []
            for i in range(first, len(images), CONNECTIONS):
                if first % 3 == 1:
                    answers.append(v2_scores(client, images[i]))
                    continue
                answer = client.post("/predict", content=images[i].tobytes(),
                                     headers={"content-type": "application/octet-stream"})  # fmt: skip
                assert answer.status_code == 200, answer.text
                answers.append(answer.json()["predictions"][0]["scores"])
            return answers

    got = at_once(one_connection, CONNECTIONS, want)
    assert relative_error(got, want) < 1e-3  # fp32 graphs against eager fp32 without TF32
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() > 0.99
    connections = {form: len(range(kind, CONNECTIONS, 3)) for kind, form in enumerate(("raw", "v2-binary", "grpc"))}
    metrics, answered = door_answers_counted(url, {form: n * EACH for form, n in connections.items()})
    assert answered == {form: n * EACH for form, n in connections.items()}
    assert "cgserve_batches_total{" in metrics


def door_answers_counted(url: str, want: dict[str, int]) -> tuple[str, dict[str, float]]:
    """/metrics, and the door's 200s by format, once they are `want` (the launcher's are read each second) or
    after 10 s."""
    latest = time.monotonic() + 10
    while True:
        metrics = settled_metrics(url)
        door = [line for line in metrics.splitlines()
                if line.startswith("cgserve_requests_total{") and 'protocol="door"' in line]  # fmt: skip
        answered = {form: sum(float(line.rsplit(" ", 1)[1]) for line in door if f'format="{form}"' in line and
                              'code="200"' in line) for form in want}  # fmt: skip
        if answered == want or time.monotonic() > latest:
            return metrics, answered


def test_the_launchers_answers_are_the_ports(tmp_path: Path) -> None:
    """POST /predict through the door's launcher: bound (its log line), each image's answer the service's port's
    (the same model, engine, label and class name; scores within 1e-5, written as orjson writes them), every
    answer counted, and its batches in the model's metrics."""
    port = free_port()
    settings = {"device": "cuda", "engine": "cuda-graph", "compile": "none", "front_door_port": str(port),
                "front_door_threads": "4", "front_door_launcher": "true"}  # fmt: skip
    log = tmp_path / "server.log"
    images = np.random.default_rng(2).integers(0, 256, (48, 1, 28, 28), dtype=np.uint8)
    with running_server(log, SERVE, **settings) as url:
        latest = time.monotonic() + 10
        while "launched and answered in C" not in log.read_text() and time.monotonic() < latest:
            time.sleep(0.1)  # bound at the door's first tend once the service serves
        assert "launched and answered in C" in log.read_text()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as door, \
                httpx.Client(base_url=url, timeout=30) as service:  # fmt: skip
            for image in images:
                headers = {"content-type": "application/octet-stream"}
                through_door = door.post("/predict", content=image.tobytes(), headers=headers)
                through_port = service.post("/predict", content=image.tobytes(), headers=headers)
                assert through_door.status_code == through_port.status_code == 200, through_door.text
                assert through_door.headers["content-type"] == "application/json"
                got, want = orjson.loads(through_door.content), orjson.loads(through_port.content)
                scores = np.array(got["predictions"][0]["scores"], np.float32)
                expected = np.array(want["predictions"][0]["scores"], np.float32)
                assert np.abs(scores - expected).max() < 1e-5
                for answer in (got, want):
                    answer["predictions"][0].pop("scores")
                assert got == want
                written = orjson.dumps(scores[None], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
                assert (
                    b'"scores":' + written + b"}]}" == through_door.content[through_door.content.index(b'"scores":') :]
                )
        metrics, answered = door_answers_counted(url, {"raw": len(images)})
        assert answered == {"raw": len(images)}
        assert "cgserve_batches_total{" in metrics
        # The feeder observes each row it takes in the door's wait; the launcher's rows never wait for a bulk.
        waited = [line for line in metrics.splitlines() if line.startswith("cgserve_front_door_wait_seconds_count")]
        assert all(float(line.rsplit(" ", 1)[1]) == 0 for line in waited), waited
    assert "Traceback" not in log.read_text()


@pytest.fixture
def twins_door(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """One process serving the seed CNN and a twin of it (the same weights under another name) on the GPU."""
    import shutil

    repository = tmp_path / "repository"
    for name in ("fashion-cnn", "fashion-twin"):
        shutil.copytree(Path(__file__).resolve().parents[2] / "models" / "repository" / "fashion-cnn",
                        repository / name)  # fmt: skip
    port, grpc_port = free_port(), free_port()
    settings = {"device": "cuda", "engine": "cuda-graph", "compile": "none", "front_door_port": str(port),
                "front_door_grpc_port": str(grpc_port), "front_door_threads": "4",
                "model_repository": str(repository), "default_model": "fashion-cnn"}  # fmt: skip
    with running_server(tmp_path / "server.log", SERVE, **settings) as url:
        yield url, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def test_two_models_behind_one_door_each_answer_their_own_requests(twins_door: tuple[str, str, str]) -> None:
    """32 connections, every other one to the twin, half over v2 HTTP and half over gRPC, at once: each model's
    graphs answer their own requests (the answer names the model) with each image's eager scores."""
    import grpc

    from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb

    url, door_url, grpc_address = twins_door
    connections = 32
    images = np.random.default_rng(1).integers(0, 256, (connections * EACH, 1, 28, 28), dtype=np.uint8)
    want = eager(images.astype(np.float32) / 255)

    def one_connection(first: int) -> list[list[float]]:
        model = ("fashion-cnn", "fashion-twin")[first % 2]
        answers = []
        if first % 4 >= 2:
            with grpc.insecure_channel(grpc_address) as channel:
                infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                            pb.ModelInferRequest.SerializeToString,
                                            pb.ModelInferResponse.FromString)  # fmt: skip
                tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
                for i in range(first, len(images), connections):
                    request = pb.ModelInferRequest(model_name=model, inputs=[tensor],
                                                   raw_input_contents=[images[i].tobytes()])  # fmt: skip
                    answer = infer(request, timeout=30)
                    assert answer.model_name == model
                    answers.append(np.frombuffer(answer.raw_output_contents[0], np.float32).tolist())
            return answers
        with httpx.Client(base_url=door_url, timeout=30) as client:
            for i in range(first, len(images), connections):
                answer = client.post(f"/v2/models/{model}/infer", content=V2_HEADER + images[i].tobytes(),
                                     headers={"inference-header-content-length": str(len(V2_HEADER))})  # fmt: skip
                assert answer.status_code == 200, answer.text
                length = int(answer.headers["inference-header-content-length"])
                assert orjson.loads(answer.content[:length])["model_name"] == model
                answers.append(np.frombuffer(answer.content[length:], np.float32).tolist())
        return answers

    assert relative_error(at_once(one_connection, connections, want), want) < 1e-3
    metrics = settled_metrics(url).splitlines()
    for model in ("fashion-cnn", "fashion-twin"):  # each model's own graphs ran
        batches = [line for line in metrics if line.startswith("cgserve_batches_total{") and f'model="{model}"' in line]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in batches) > 0, model
