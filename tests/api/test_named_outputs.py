"""Named outputs over HTTP (the app through its ASGI lifespan, on the CPU): POST /predict answers each output
by name, the Open Inference Protocol one tensor per output with its datatype and shape (JSON and binary,
filtered by the request's outputs), its metadata and configuration list every output, and the
classification extension answers class scores alone. Every answer equals the model run here, eagerly.
gRPC's answers: tests/integration/test_named_outputs_grpc.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from tests.output_models import eager, images, write_repository

DTYPES = {"FP32": "<f4", "INT64": "<i8"}
PIXELS = images(3, seed=7)
X = PIXELS.astype(np.float32) / 255
WANT_SHAPES = {
    "embedder": {"embedding": ("FP32", [3, 512])},
    "detector": {"boxes": ("FP32", [3, 5, 4]), "scores": ("FP32", [3, 5]), "labels": ("INT64", [3, 5])},
    "tagger": {"tags": ("FP32", [3, 3]), "embedding": ("FP32", [3, 8])},
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("outputs"))


@pytest.fixture(scope="module")
def client(repository: Path) -> Iterator[TestClient]:
    settings = Settings(model_repository=repository, device="cpu", max_delay_ms=0.0)
    with TestClient(create_app(settings)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


def close(got: np.ndarray, want: np.ndarray, name: str) -> None:
    assert got.shape == want.shape, name
    if want.dtype.kind == "i":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def v2_request(binary: bool = False, **document: Any) -> tuple[bytes, dict[str, str]]:
    """Three images: FP32 intensities as JSON, or UINT8 pixels as binary tensor data."""
    if not binary:
        tensor = {"name": "input", "datatype": "FP32", "shape": [3, 3, 16, 16], "data": X.reshape(-1).tolist()}
        return orjson.dumps({"inputs": [tensor], **document}), {"content-type": "application/json"}
    tensor = {
        "name": "input",
        "datatype": "UINT8",
        "shape": [3, 3, 16, 16],
        "parameters": {"binary_data_size": PIXELS.nbytes},
    }
    header = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}, **document})
    return header + PIXELS.tobytes(), {"inference-header-content-length": str(len(header))}


def v2_outputs(answer: Any) -> dict[str, tuple[dict[str, Any], np.ndarray]]:
    """name → (its description, its values) of a v2 answer, JSON or binary."""
    assert answer.status_code == 200, answer.text
    length = answer.headers.get("inference-header-content-length")
    header = orjson.loads(answer.content[: int(length)] if length else answer.content)
    raw, at, found = answer.content[int(length) :] if length else b"", 0, {}
    for output in header["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            values = np.array(output["data"], dtype=DTYPES[output["datatype"]])
        else:
            values = np.frombuffer(raw[at : at + size], dtype=DTYPES[output["datatype"]])
            at += size
        found[output["name"]] = (output, values.reshape(output["shape"]))
    assert at == len(raw)
    return found


@pytest.mark.parametrize("kind", list(WANT_SHAPES))
def test_predict_answers_each_output_by_name(client: TestClient, repository: Path, kind: str) -> None:
    answer = client.post(f"/v1/models/{kind}/predict", json={"instances": X.tolist()})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    want = eager(kind, repository, X)
    assert ("postprocess" in body) == (kind == "tagger")  # class scores' postprocess, where there are some
    for name, values in want.items():
        if name == "tags":  # class scores: today's label, class_name and scores
            got = np.array([p["scores"] for p in body["predictions"]], dtype=np.float32)
            labels = [p["label"] for p in body["predictions"]]
            assert labels == values.argmax(axis=1).tolist()
            assert [p["class_name"] for p in body["predictions"]] == [["cat", "dog", "owl"][i] for i in labels]
        else:
            got = np.array([p[name] for p in body["predictions"]], dtype=values.dtype)
        close(got, values, name)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("kind", list(WANT_SHAPES))
def test_v2_answers_one_tensor_per_output(client: TestClient, repository: Path, kind: str, binary: bool) -> None:
    body, headers = v2_request(binary)
    outputs = v2_outputs(client.post(f"/v2/models/{kind}/infer", content=body, headers=headers))
    want = eager(kind, repository, X)
    assert list(outputs) == list(WANT_SHAPES[kind])  # the model's order
    for name, (described, values) in outputs.items():
        assert (described["datatype"], described["shape"]) == WANT_SHAPES[kind][name]
        assert ("postprocess" in described.get("parameters", {})) == (name == "tags")
        close(values, want[name], name)


def test_v2_answers_the_outputs_asked_for_in_their_order(client: TestClient, repository: Path) -> None:
    asked = [{"name": "labels"}, {"name": "boxes", "parameters": {"binary_data": False}}]
    body, headers = v2_request(True, outputs=asked)
    outputs = v2_outputs(client.post("/v2/models/detector/infer", content=body, headers=headers))
    assert list(outputs) == ["labels", "boxes"]
    assert "binary_data_size" in outputs["labels"][0]["parameters"] and "data" in outputs["boxes"][0]
    want = eager("detector", repository, X)
    close(outputs["labels"][1], want["labels"], "labels")
    close(outputs["boxes"][1], want["boxes"], "boxes")


def test_classification_answers_class_scores_alone(client: TestClient, repository: Path) -> None:
    body, headers = v2_request(outputs=[{"name": "tags", "parameters": {"classification": 2}}, {"name": "embedding"}])
    answer = client.post("/v2/models/tagger/infer", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    tags, embedding = answer.json()["outputs"]
    order = np.argsort(-eager("tagger", repository, X)["tags"], axis=1)[:, :2]
    assert tags["datatype"] == "BYTES" and tags["shape"] == [3, 2]
    assert [int(text.split(":")[1]) for text in tags["data"]] == order.reshape(-1).tolist()
    assert embedding["datatype"] == "FP32" and embedding["shape"] == [3, 8]
    for model, name in (("tagger", "embedding"), ("detector", "scores"), ("embedder", "embedding")):
        body, headers = v2_request(outputs=[{"name": name, "parameters": {"classification": 1}}])
        refused = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
        assert refused.status_code == 400, refused.text
        assert f'"{name}" is not class scores' in refused.json()["error"]


@pytest.mark.parametrize(
    ("outputs", "words"),
    [
        ([{"name": "probabilities"}], 'no output named \'probabilities\'; expected outputs among "boxes", "scores", '),
        ([{"name": "boxes"}] * 3, "3 times"),
    ],
)
def test_unknown_and_repeated_outputs_are_refused(client: TestClient, outputs: list[Any], words: str) -> None:
    body, headers = v2_request(outputs=outputs)
    refused = client.post("/v2/models/detector/infer", content=body, headers=headers)
    assert refused.status_code == 400 and words in refused.json()["error"], refused.text


def test_metadata_and_configuration_list_every_output(client: TestClient) -> None:
    metadata = client.get("/v2/models/detector").json()
    assert metadata["outputs"] == [
        {"name": "boxes", "datatype": "FP32", "shape": [-1, 5, 4]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, 5]},
        {"name": "labels", "datatype": "INT64", "shape": [-1, 5]},
    ]
    config = client.get("/v2/models/embedder/config").json()
    assert config["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [512]}]
