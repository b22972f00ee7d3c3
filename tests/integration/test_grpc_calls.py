"""gRPC calls as Triton's client makes them (issue 23.5): a call the client cancels or whose deadline
passes is counted as CANCELLED or DEADLINE_EXCEEDED, not OK, and so is a request in flight on a
stream the client cancels; and a message as large as a served
model's max_batch_size of FP32 images (perf_analyzer's 32 ResNet-50 images: 19,267,681 bytes)
is taken in though CGSERVE_MAX_BODY_BYTES is 16 MiB, and so is a v2 HTTP infer body of them.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from loadtest.server_process import free_port, free_ports, running, service_env
from tests.integration.server_process import running_server, settled_metrics
from tests.reliability.common import SERVE, seed_with_forward

WIDE_MODEL = """import torch


class Pooled(torch.nn.Module):  # any [3, 224, 224] CNN input in, 10 classes out
    def forward(self, x):
        return torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1).repeat(1, 4)[:, :10]


def build():
    return Pooled().eval()
"""
WIDE_TOML = """format = "python"
factory = "model:build"
input_shape = [3, 224, 224]
buckets = [1, 8, 32]
labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
"""
WAIT_S = 30.0


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(started, release): the gated model's forward creates `started`, waits for `release`, then removes
    `started` as it returns, so `started` exists exactly while a batch is held."""
    folder = tmp_path_factory.mktemp("gates")
    started, release = folder / "started", folder / "release"
    release.touch()  # open while the engine warms up
    return started, release


def gated_forward(started: Path, release: Path) -> str:
    """The gated model's forward: creates `started`, waits for `release`, removes `started` as it returns."""
    return (
        f"import os\nopen({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.002)\n"
        f"os.remove({str(started)!r})"
    )


def serve_gated(
    tmp_path_factory: pytest.TempPathFactory, gates: tuple[Path, Path], **settings: str
) -> Iterator[dict[str, str]]:
    repository = seed_with_forward(tmp_path_factory.mktemp("repo"), "gated", gated_forward(*gates))
    (repository / "wide").mkdir()
    (repository / "wide" / "model.py").write_text(WIDE_MODEL)
    (repository / "wide" / "model.toml").write_text(WIDE_TOML)
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("grpc") / "server.log"
    with running_server(
        log, command=SERVE, device="cpu", grpc_port=str(grpc_port), model_repository=str(repository), **settings
    ) as url:
        yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}", "log": str(log)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gates: tuple[Path, Path]) -> Iterator[dict[str, str]]:
    yield from serve_gated(tmp_path_factory, gates)


@pytest.fixture(scope="module")
def server_with_access_log(
    tmp_path_factory: pytest.TempPathFactory, gates: tuple[Path, Path]
) -> Iterator[dict[str, str]]:
    """The same with the access log on: the access interceptor wraps every call, streams too."""
    yield from serve_gated(tmp_path_factory, gates, access_log="true")


def counts(url: str, model: str) -> dict[str, float]:
    """gRPC answers of `model` by status name."""
    return {
        sample.labels["code"]: sample.value
        for family in text_string_to_metric_families(settled_metrics(url))
        for sample in family.samples
        if sample.name == "cgserve_requests_total"
        and sample.labels["protocol"] == "grpc"
        and sample.labels["model"] == model
    }


def wait_for_count(url: str, model: str, code: str, want: float) -> dict[str, float]:
    """The counts once `code` reached `want` (the server counts a call as its handler ends), or WAIT_S."""
    give_up = time.monotonic() + WAIT_S
    while (seen := counts(url, model)).get(code, 0) < want and time.monotonic() < give_up:
        pass  # counts() waits for the server's metrics to flush
    return seen


@contextmanager
def batches_held(gates: tuple[Path, Path]) -> Iterator[None]:
    """The gated model holds each batch it starts until the block ends; the block's end releases the
    held batch and waits for it to return. Without that wait the next test's hold could begin before a
    slow machine's held forward saw the release, so that batch stayed held and the next call never
    started (a CI run)."""
    started, release = gates
    release.unlink()
    try:
        yield
    finally:
        release.touch()
        give_up = time.monotonic() + WAIT_S
        while started.exists() and time.monotonic() < give_up:  # a file offers nothing to await: poll
            time.sleep(0.005)
    assert not started.exists(), "the held batch did not return once released"


def one_image() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", [1, 1, 28, 28], "UINT8")
    tensor.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.uint8))
    return tensor


def test_a_call_past_its_deadline_is_counted_deadline_exceeded(
    server: dict[str, str], gates: tuple[Path, Path]
) -> None:
    with batches_held(gates):
        with pytest.raises(InferenceServerException) as raised:
            triton_grpc.InferenceServerClient(server["grpc"]).infer("gated", [one_image()], client_timeout=0.5)
        assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED", raised.value
        seen = wait_for_count(server["url"], "gated", "DEADLINE_EXCEEDED", 1)  # its batch still held, as below
    assert seen.get("DEADLINE_EXCEEDED") == 1 and "200" not in seen, seen


def test_a_call_the_client_cancels_is_counted_cancelled(server: dict[str, str], gates: tuple[Path, Path]) -> None:
    started = gates[0]
    before = counts(server["url"], "gated").get("CANCELLED", 0)  # the stream's test may have run first
    ended = threading.Event()
    errors: list[object] = []

    def finished(result: object, error: object) -> None:
        errors.append(error)
        ended.set()

    with batches_held(gates):
        call = triton_grpc.InferenceServerClient(server["grpc"]).async_infer("gated", [one_image()], callback=finished)
        give_up = time.monotonic() + WAIT_S
        while not started.exists() and time.monotonic() < give_up:  # a file offers nothing to await: poll
            time.sleep(0.005)
        assert started.exists()
        call.cancel()
        assert ended.wait(WAIT_S)
        assert "CANCELLED" in str(errors[0]), errors
        # Counted while its batch is still held (the forward waits for `release`): the handler is cancelled,
        # not answered. Released only after, so a slow machine cannot let the batch answer it first (a CI
        # run counted it "200" when `release` came before the server had read the cancellation).
        seen = wait_for_count(server["url"], "gated", "CANCELLED", before + 1)
    assert seen.get("CANCELLED") == before + 1 and "200" not in seen, seen


@pytest.mark.parametrize("served", ["server", "server_with_access_log"])
def test_a_stream_the_client_cancels_counts_its_request_in_flight_cancelled(
    served: str, gates: tuple[Path, Path], request: pytest.FixtureRequest
) -> None:
    """Counted CANCELLED while its batch is held, and, with the access log on, the stream's line says
    CANCELLED. (A request in flight makes the cancel certain: grpc.aio hands a client's cancel to a
    stream's handler as the end of its requests first, so a stream with nothing in flight may end OK.)"""
    server: dict[str, str] = request.getfixturevalue(served)
    started = gates[0]
    before = counts(server["url"], "gated").get("CANCELLED", 0)
    triton = triton_grpc.InferenceServerClient(server["grpc"])
    stream_id = f"cancelled-stream-{served}"
    with batches_held(gates):
        triton.start_stream(callback=lambda result, error: None, headers={"x-request-id": stream_id})
        try:
            triton.async_stream_infer("gated", [one_image()], request_id="held")
            give_up = time.monotonic() + WAIT_S
            while not started.exists() and time.monotonic() < give_up:  # a file offers nothing to await: poll
                time.sleep(0.005)
            assert started.exists()
        finally:
            triton.stop_stream(cancel_requests=True)
        seen = wait_for_count(server["url"], "gated", "CANCELLED", before + 1)  # while its batch is held
    assert seen.get("CANCELLED") == before + 1 and "200" not in seen, seen
    if served == "server_with_access_log":
        log = Path(server["log"])
        poll_until(lambda: stream_id in log.read_text(errors="replace"))  # the access log's thread writes it
        (line,) = (json.loads(t) for t in log.read_text(errors="replace").splitlines() if stream_id in t)
        assert line["status"] == "CANCELLED" and line["path"].endswith("/ModelStreamInfer"), line


def test_a_stopping_server_answers_what_a_stream_read_then_ends_it_unavailable(tmp_path: Path) -> None:
    """SIGTERM with a request of a stream in flight: its answer comes, then the stream ends UNAVAILABLE
    saying why (not cut when the grace ends, and not left open reading requests it will not answer)."""
    started, release = tmp_path / "started", tmp_path / "release"
    release.touch()  # open while the engine warms up
    repository = seed_with_forward(tmp_path / "repo", "gated", gated_forward(started, release))
    port, grpc_port = free_ports(2)
    env = service_env(port, device="cpu", grpc_port=grpc_port, model_repository=repository, drain_seconds=0.2)
    log = tmp_path / "server.log"
    more = threading.Event()
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    held = service_pb2.ModelInferRequest(
        model_name="gated", id="held", inputs=[tensor], raw_input_contents=[bytes(784)]
    )

    def requests() -> Iterator[Any]:
        yield held
        more.wait(WAIT_S)  # the client keeps its stream open

    with running(SERVE, log, port=port, env=env | {"CGSERVE_LOG_LEVEL": "info"}, ready_timeout_s=90) as server:
        release.unlink()
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
            poll_until(started.exists)
            os.kill(server.proc.pid, signal.SIGTERM)
            poll_until(lambda: "gRPC stopping" in log.read_text(errors="replace"))
            release.touch()  # the held request's batch ends now, while the server stops
            answers = []
            with pytest.raises(grpc.RpcError) as ended:
                for answer in stream:
                    answers.append(answer)
            more.set()
    assert [(a.infer_response.id, a.error_message) for a in answers] == [("held", "")]
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE and "the server is stopping" in ended.value.details()


def poll_until(done: Callable[[], bool]) -> None:
    give_up = time.monotonic() + WAIT_S
    while not done() and time.monotonic() < give_up:  # a file offers nothing to await: poll
        time.sleep(0.01)
    assert done()


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory: pytest.TempPathFactory, gates: tuple[Path, Path]) -> Iterator[dict[str, str]]:
    """A queue of 256 rows: a stream of 64-image requests may hold 64 of them (a quarter)."""
    yield from serve_gated(tmp_path_factory, gates, queue_limit="256", max_instances="64")


@pytest.mark.parametrize("streams", [1, 8])
def test_streams_of_large_requests_leave_the_queue_to_other_clients(
    small_queue_server: dict[str, str], gates: tuple[Path, Path], streams: int
) -> None:
    """Streams on one connection writing 64-image requests faster than they are served hold a quarter of the
    model's queue between them, and wait for answers before they read on: another client's call is queued, not
    refused, and every streamed request is answered. (Before, one stream held up to 256 requests: the queue
    filled and the other client got UNAVAILABLE, as did the stream's own requests past the queue; then each
    stream held a quarter, and eight streams on one connection filled it again.)"""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[64, 1, 28, 28])
    large = [
        service_pb2.ModelInferRequest(
            model_name="gated", id=f"large-{n}", inputs=[tensor], raw_input_contents=[bytes(64 * 784)]
        )
        for n in range(24)
    ]  # 1,536 rows: six times the queue
    one = service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    other = service_pb2.ModelInferRequest(model_name="gated", inputs=[one], raw_input_contents=[bytes(784)])
    share = len(large) // streams
    with (
        grpc.insecure_channel(small_queue_server["grpc"]) as streaming,
        grpc.insecure_channel(small_queue_server["grpc"]) as calling,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(streaming)
        with batches_held(gates):
            answers = [
                stub.ModelStreamInfer(iter(large[i * share : (i + 1) * share]), timeout=WAIT_S) for i in range(streams)
            ]
            poll_until(gates[0].exists)  # a stream's first batch is held
            time.sleep(0.5)  # every stream has sent what it could
            call = service_pb2_grpc.GRPCInferenceServiceStub(calling).ModelInfer.future(other, timeout=WAIT_S)
            time.sleep(0.5)  # a refusal would have come by now
            assert not call.done(), call.exception()
        assert call.result().model_name == "gated"
        sent = [(answer.infer_response.id, answer.error_message) for stream in answers for answer in stream]
    assert sorted(sent) == sorted((request.id, "") for request in large)


def test_perf_analyzers_32_fp32_resnet_images_fit_one_message(server: dict[str, str]) -> None:
    images = np.random.default_rng(0).random((32, 3, 224, 224), dtype=np.float32)  # 19,267,584 bytes
    tensor = triton_grpc.InferInput("input", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    result = triton_grpc.InferenceServerClient(server["grpc"]).infer("wide", [tensor])
    assert result.as_numpy("probabilities").shape == (32, 10)


def test_tritonclient_https_32_fp32_resnet_images_fit_one_body_and_only_v2_infer_takes_them(
    server: dict[str, str],
) -> None:
    """The model configuration says max_batch_size 32; HTTP refused that batch with 413 (16 MiB), gRPC took it."""
    client = triton_http.InferenceServerClient(server["url"].removeprefix("http://"), network_timeout=60)
    assert client.get_model_config("wide")["max_batch_size"] == 32
    images = np.random.default_rng(0).random((32, 3, 224, 224), dtype=np.float32)  # 19,267,584 bytes
    tensor = triton_http.InferInput("input", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images, binary_data=True)
    assert client.infer("wide", [tensor]).as_numpy("probabilities").shape == (32, 10)
    # The same bytes to a route of our own: CGSERVE_MAX_BODY_BYTES, as before.
    answer = httpx.post(f"{server['url']}/v1/models/wide/predict?dtype=float32", content=images.tobytes(),
                        headers={"content-type": "application/octet-stream"}, timeout=60)  # fmt: skip
    assert answer.status_code == 413, answer.text


def test_a_large_typed_fp32_input_is_decoded(server: dict[str, str]) -> None:
    """Typed contents (not raw_input_contents) past the size decoded off the event loop."""
    images = np.random.default_rng(1).random((8, 3, 224, 224), dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="wide")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(images.shape))
    tensor.contents.fp32_contents.extend(images.reshape(-1).tolist())

    options = [("grpc.max_send_message_length", 64 * 2**20)]
    with grpc.insecure_channel(server["grpc"], options=options) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=WAIT_S)
    probabilities = np.frombuffer(answer.raw_output_contents[0], dtype="<f4").reshape(8, 10)
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)


def test_a_load_with_model_control_off_says_how_to_turn_it_on(server: dict[str, str]) -> None:
    """RepositoryModelLoad on a server whose model control is off: UNAVAILABLE in Triton's words, and, as the HTTP
    port says it, the setting that allows it."""
    with pytest.raises(InferenceServerException) as refused:
        triton_grpc.InferenceServerClient(server["grpc"]).load_model("gated")
    assert refused.value.status() == str(grpc.StatusCode.UNAVAILABLE)
    assert "not allowed if polling is enabled" in refused.value.message()
    assert "CGSERVE_MODEL_CONTROL=explicit" in refused.value.message()
