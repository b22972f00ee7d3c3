"""The body timeout bounds each pause of a body, not the whole body, and answers 408 in the shape of
the route that was reading it (app/http/protocol.py times the pauses; app/http/limits.py raises).

Against the real server on the CPU, with CGSERVE_BODY_TIMEOUT_S=1.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.server_process import running_server
from tests.reliability.common import SERVE, record_figure

BODY_TIMEOUT_S = 1.0
IMAGE = bytes(range(256)) * 3 + bytes(16)  # one 28×28 uint8 image: 784 bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("pauses") / "server.log"
    with running_server(log, command=SERVE, device="cpu", body_timeout_s=str(BODY_TIMEOUT_S)) as url:
        yield url


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return sock


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def read_answer(sock: socket.socket) -> tuple[int, dict[str, object]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer: {data!r}"
        data += chunk
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head_bytes.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head_bytes.split()[1]), json.loads(body)


def rejections(url: str, reason: str) -> float:
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    return sum(
        sample.value for family in families if family.name == "cgserve_rejections" for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("reason") == reason
    )  # fmt: skip


def test_a_body_whose_every_pause_is_short_is_served_however_long_it_takes(server: str) -> None:
    with connect(server) as sock:
        sock.sendall(head("/predict", len(IMAGE)))
        for start in range(0, len(IMAGE), 196):  # four chunks, 0.6 s apart: 2.4 s in all, > the timeout
            # Kept: a slow client trickling its body is the behaviour under test.
            time.sleep(0.6 * BODY_TIMEOUT_S)
            sock.sendall(IMAGE[start : start + 196])
        status, answer = read_answer(sock)
    assert status == 200, answer
    assert len(answer["predictions"]) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/predict", "error"), ("/v2/models/fashion-cnn/infer", "v2")],
)
def test_a_body_that_stops_gets_408_in_its_routes_shape_and_is_counted(server: str, path: str, shape: str) -> None:
    before = rejections(server, "request_timeout")
    with connect(server) as sock:
        sock.sendall(head(path, len(IMAGE)) + IMAGE[:100])  # then nothing
        started = time.monotonic()
        status, answer = read_answer(sock)
        waited = time.monotonic() - started
    assert status == 408, answer
    assert waited >= BODY_TIMEOUT_S, waited  # never before the timeout; how soon after is the machine's
    record_figure(f"body_timeout_{shape}", waited_s=waited, body_timeout_s=BODY_TIMEOUT_S)  # was < timeout + 2
    if shape == "v2":  # the Open Inference Protocol's {"error": "<message>"}
        assert "paused" in str(answer["error"])
    else:
        assert answer["error"]["code"] == "request_timeout", answer  # type: ignore[index]
        assert "CGSERVE_BODY_TIMEOUT_S" in answer["error"]["expected"]  # type: ignore[index]
    assert rejections(server, "request_timeout") == before + 1
