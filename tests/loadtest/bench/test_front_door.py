"""The front-door prototype (bench/front_door): each connection gets its own image's answer, refusals are
HTTP answers, and its bulk answers are encode_predictions' bytes. Built with the machine's C compiler."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.front_door.answers import Answers
from loadtest.server_process import ServerProcess, free_port, running
from models.fashion_mnist import load_test_sample
from tests.seed_model import seed_spec

ROOT = Path(__file__).resolve().parents[3]
COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler to build the prototype")


@pytest.fixture(scope="module", params=["answered", "clock"])
def door(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("front-door")
    library = folder / "libfrontdoor.so"
    source = ROOT / "bench" / "front_door" / "front_door.c"
    assert COMPILER is not None
    subprocess.run([COMPILER, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(library), str(source)], check=True)
    port = free_port()
    argv = [sys.executable, "-m", "bench.front_door.serve", "--library", str(library), "--port", str(port),
            "--threads", "2", "--device", "cpu", "--take", request.param]  # fmt: skip
    with running(argv, folder / "server.log", port=port, cwd=ROOT) as server:
        yield server


def sample_images(count: int) -> list[bytes]:
    return [image.tobytes() for image in load_test_sample()[0][:count]]  # 784 uint8 pixels each


def exchange(connection: socket.socket, request: bytes) -> tuple[bytes, bytes]:
    """One request written, its answer read whole from the same connection: (status line, body)."""
    connection.sendall(request)

    def more(data: bytes) -> bytes:
        chunk = connection.recv(65536)
        assert chunk, f"the connection was closed after {data[:200]!r}"
        return data + chunk

    data = b""
    while b"\r\n\r\n" not in data:
        data = more(data)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:])
    while len(body) < length:
        body = more(body)
    return head.split(b"\r\n")[0], body


def predict(client: httpx.Client, body: bytes) -> dict:
    answer = client.post("/predict", content=body, headers={"content-type": "application/octet-stream"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_each_connection_gets_its_own_images_answer(door: ServerProcess) -> None:
    images = sample_images(24)
    with httpx.Client(base_url=door.url) as client:  # one at a time: each alone in its bulk
        alone = [predict(client, image)["predictions"][0] for image in images]
    assert len({p["label"] for p in alone}) > 3  # images of several classes: a mix-up would show

    def one_connection(first: int) -> list[dict]:  # 8 connections × 3 requests, all in flight together
        with httpx.Client(base_url=door.url) as client:
            return [predict(client, images[i])["predictions"][0] for i in range(first, len(images), 8)]

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one_connection, range(8)))
    for first, answers in enumerate(together):
        for i, answer in zip(range(first, len(images), 8), answers, strict=True):
            assert answer["label"] == alone[i]["label"]
            np.testing.assert_allclose(answer["scores"], alone[i]["scores"], atol=1e-5)


def test_refusals_are_answers_on_the_connection(door: ServerProcess) -> None:
    with httpx.Client(base_url=door.url) as client:
        assert client.get("/readyz").status_code == 200
    post = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
    image = sample_images(1)[0]
    with socket.create_connection(("127.0.0.1", door.port), timeout=5) as connection:  # one connection throughout
        status, body = exchange(connection, post % (b"/predict", 100) + b"\0" * 100)
        assert status.startswith(b"HTTP/1.1 400 ") and b"one image" in body, (status, body)
        status, _ = exchange(connection, post % (b"/elsewhere", len(image)) + image)
        assert status.startswith(b"HTTP/1.1 404 "), status
        status, body = exchange(connection, post % (b"/predict", len(image)) + image)  # it goes on after refusals
        assert status.startswith(b"HTTP/1.1 200 ") and b'"predictions"' in body, (status, body)
    for length in (b"-1", b"18446744073709551615", b"12abc", b""):  # refused, not read past the buffer
        with socket.create_connection(("127.0.0.1", door.port), timeout=5) as raw:
            raw.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 400 "), length
    with httpx.Client(base_url=door.url) as client:
        predict(client, image)  # and the server still serves


def test_bulk_answers_are_encode_predictions_bytes() -> None:
    Answers(seed_spec(), "cuda-graph").check()  # raises ValueError where a byte differs
