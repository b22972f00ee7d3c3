"""Named outputs (model.toml's [[outputs]]) from a real server process, as Triton's clients read them: gRPC
ModelInfer answers one tensor per output with its datatype and shape, the outputs asked for alone, the
classification extension on class scores alone; the inline HTTP path (app/http/inline.py) answers /predict
and v2 binary alike. Every answer equals the model run here, eagerly. In-process HTTP answers:
tests/api/test_named_outputs.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from loadtest.server_process import free_port
from tests.integration.server_process import running_server
from tests.output_models import TOMLS, eager, images, write_repository
from tests.reliability.common import SERVE

PIXELS = images(2, seed=11)
X = PIXELS.astype(np.float32) / 255


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("outputs"))


# One process; or two HTTP workers and the engine process, whose probe's layout the workers cut answers by.
DESIGNS = {"one-process": {}, "engine-process": {"workers": "2", "engine_process": "true"}}


@pytest.fixture(scope="module", params=list(DESIGNS))
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, repository: Path
) -> Iterator[dict[str, str]]:
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("named-outputs") / "server.log"
    with running_server(
        log, command=SERVE, device="cpu", grpc_port=str(grpc_port), model_repository=str(repository),
        **DESIGNS[request.param],
    ) as url:  # fmt: skip
        yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}"}


def close(got: np.ndarray, want: np.ndarray, name: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, name
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def grpc_input(datatype: str = "UINT8") -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", list(PIXELS.shape), datatype)
    tensor.set_data_from_numpy(PIXELS if datatype == "UINT8" else X)
    return tensor


@pytest.mark.parametrize("kind", list(TOMLS))
def test_grpc_answers_every_output_with_its_datatype_and_shape(
    server: dict[str, str], repository: Path, kind: str
) -> None:
    client = triton_grpc.InferenceServerClient(server["grpc"])
    result = client.infer(kind, [grpc_input("FP32")])
    want = eager(kind, repository, X)
    described = {output.name: output for output in result.get_response().outputs}
    metadata = client.get_model_metadata(kind)
    assert [output.name for output in metadata.outputs] == list(described)  # the model's order
    for name, values in want.items():
        assert described[name].datatype == ("INT64" if name == "labels" else "FP32")
        assert list(described[name].shape) == list(values.shape)
        close(result.as_numpy(name), values, name)


def test_grpc_answers_the_outputs_asked_for_and_classifies_class_scores_alone(
    server: dict[str, str], repository: Path
) -> None:
    client = triton_grpc.InferenceServerClient(server["grpc"])
    result = client.infer("detector", [grpc_input()], outputs=[triton_grpc.InferRequestedOutput("labels")])
    assert [output.name for output in result.get_response().outputs] == ["labels"]
    np.testing.assert_array_equal(result.as_numpy("labels"), eager("detector", repository, X)["labels"])
    asked = [triton_grpc.InferRequestedOutput("tags", class_count=2), triton_grpc.InferRequestedOutput("embedding")]
    result = client.infer("tagger", [grpc_input()], outputs=asked)
    order = np.argsort(-eager("tagger", repository, X)["tags"], axis=1)[:, :2]
    tags = result.as_numpy("tags")
    assert tags.shape == (2, 2) and [int(t.split(b":")[1]) for t in tags.reshape(-1)] == order.reshape(-1).tolist()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("tagger", [grpc_input()], outputs=[triton_grpc.InferRequestedOutput("embedding", class_count=1)])
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert '"embedding" is not class scores' in str(raised.value)


def test_the_inline_http_path_answers_named_outputs(server: dict[str, str], repository: Path) -> None:
    want = eager("detector", repository, X)
    answer = httpx.post(f"{server['url']}/v1/models/detector/predict", json={"instances": X.tolist()})
    assert answer.status_code == 200, answer.text
    for name, values in want.items():
        close(np.array([p[name] for p in answer.json()["predictions"]], dtype=values.dtype), values, name)
    client = triton_http.InferenceServerClient(server["url"].removeprefix("http://"))
    tensor = triton_http.InferInput("input", list(PIXELS.shape), "UINT8")
    tensor.set_data_from_numpy(PIXELS, binary_data=True)
    asked = [triton_http.InferRequestedOutput(name, binary_data=True) for name in ("scores", "labels")]
    result = client.infer("detector", [tensor], outputs=asked)
    close(result.as_numpy("scores"), want["scores"], "scores")
    close(result.as_numpy("labels"), want["labels"], "labels")
    assert result.as_numpy("boxes") is None  # not asked for
