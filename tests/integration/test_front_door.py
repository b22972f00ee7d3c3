"""The front door (app/front_door) in the real server process: each connection gets its own image's answer,
in the service's own bytes, with one process and with the engine process; Triton's HTTP client gets the HTTP
port's v2 answers from it, and its v2 refusals in the protocol's shape; every refusal is an HTTP answer on
the connection; its limits (token, idle and slow connections, connection cap) hold; it counts into /metrics;
and a shutdown answers what it took. Image uploads (a JPEG or PNG as the body) get the HTTP port's answers, and
door.c tells the JPEGs nvJPEG takes from those Pillow decodes. door.c is built by the server itself, with the
machine's C compiler."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as triton_http
from PIL import Image
from tritonclient.utils import InferenceServerException

from app.codecs.bodies import MAX_JPEG_SCANS
from loadtest.server_process import running
from models.fashion_mnist import load_test_sample
from tests.hostile_images import scan_bomb, scan_bomb_hiding_its_frame, with_scan_markers_before_its_frame
from tests.integration.door_toolchain import door_toolchain
from tests.integration.server_process import ROOT, free_port, requests_counted, running_server, settled_metrics


@pytest.fixture(autouse=True)
def compiler() -> None:
    """The server builds door.c and grpc.c with cc; without it or nghttp2's headers these tests skip, except on CI
    (.ci/run installs gcc and libnghttp2-dev)."""
    lacking = door_toolchain()
    if lacking is not None:
        message = f"{lacking} to build app/front_door/door.c: apt-get install gcc libc6-dev libnghttp2-dev"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the front door's tests must run)")
        pytest.skip(message)


SERVE = (sys.executable, "-m", "app.cli", "serve")
TOKEN = "front-door-token-0123456789abcdef"
RAW = {"content-type": "application/octet-stream", "authorization": f"Bearer {TOKEN}"}
MAX_CONNECTIONS = 12
POST = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n%sContent-Length: %d\r\n\r\n"
AUTH = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    door_port = free_port()
    settings = {
        "device": "cpu",
        "front_door_port": str(door_port),
        "front_door_threads": "2",
        "auth_tokens": TOKEN,
        "keepalive_timeout_s": "1",
        "header_timeout_s": "1",
        "body_timeout_s": "1",
        "max_connections": str(MAX_CONNECTIONS),
        "log_level": "debug",
    }
    with running_server(tmp_path_factory.mktemp("front-door") / "server.log", SERVE, **settings) as url:
        yield {"url": url, "door": f"http://127.0.0.1:{door_port}", "port": door_port}


def sample_images(count: int) -> list[bytes]:
    return [image.tobytes() for image in load_test_sample()[0][:count]]  # 784 uint8 pixels each


def encoded(pixels: np.ndarray, form: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, form, **options)
    return buffer.getvalue()


def garment_uploads(count: int) -> list[bytes]:
    """Fashion-MNIST garments as JPEGs and PNGs, each under the 784 bytes a row of the seed CNN holds."""
    garments = load_test_sample()[0][:count]  # (count, 28, 28) uint8
    return [encoded(g, "JPEG", quality=75, optimize=True) for g in garments] + [
        encoded(g, "PNG", optimize=True) for g in garments
    ]


def exchange(connection: socket.socket, request: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One request written, its answer read whole from the same connection: (status line, headers, body)."""
    connection.sendall(request)
    return read_answer(connection)


def read_answers(connection: socket.socket, count: int) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """The next `count` answers on `connection`, in order: one read may hold the end of one and the start of
    the next, kept for it; what follows the last is dropped."""
    answers, data = [], b""
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            status, *lines = data[:head_end].split(b"\r\n")
            headers = {name.strip().lower(): value.strip() for name, _, value in (ln.partition(b":") for ln in lines)}
            end = head_end + 4 + int(headers[b"content-length"])
            if len(data) >= end:
                answers.append((status, headers, data[head_end + 4 : end]))
                data = data[end:]
                continue
        chunk = connection.recv(65536)
        assert chunk, f"the connection was closed after {len(answers)} answers and {data[:200]!r}"
        data += chunk
    return answers


def read_answer(connection: socket.socket) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """The next answer on `connection`, whole: (status line, headers, body); what follows it in the same read is
    dropped (read_answers keeps it, for pipelined answers)."""
    return read_answers(connection, 1)[0]


def closed_within(connection: socket.socket, seconds: float) -> bytes | None:
    """What the server wrote before closing the connection, or None if it is still open after `seconds`."""
    connection.settimeout(seconds)
    data = b""
    try:
        while chunk := connection.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    return data


def predict(client: httpx.Client, body: bytes) -> dict:
    answer = client.post("/predict", content=body, headers=RAW)
    assert answer.status_code == 200, answer.text
    return answer.json()


def each_gets_its_own(door: str, service: str) -> None:
    images = sample_images(24)
    with httpx.Client(base_url=service) as client:  # the service's own port: the reference
        alone = [predict(client, image)["predictions"][0] for image in images]
    assert len({p["label"] for p in alone}) > 3  # images of several classes: a mix-up would show

    def one_connection(first: int) -> list[dict]:  # 8 connections × 3 requests, all in flight together
        with httpx.Client(base_url=door) as client:
            return [predict(client, images[i]) for i in range(first, len(images), 8)]

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one_connection, range(8)))
    for first, answers in enumerate(together):
        for i, answer in zip(range(first, len(images), 8), answers, strict=True):
            assert answer["model"] == "fashion-cnn" and answer["engine"] == "eager"
            assert answer["predictions"][0]["label"] == alone[i]["label"]
            np.testing.assert_allclose(answer["predictions"][0]["scores"], alone[i]["scores"], atol=1e-5)


def test_each_connection_gets_its_own_images_answer(server: dict[str, Any]) -> None:
    each_gets_its_own(server["door"], server["url"])


def test_the_answer_is_the_services_own(server: dict[str, Any]) -> None:
    image = sample_images(1)[0]
    with httpx.Client() as client:
        mine = client.post(server["door"] + "/predict", content=image, headers=RAW)
        theirs = client.post(server["url"] + "/predict", content=image, headers=RAW)
    assert mine.headers["content-type"] == "application/json"
    assert mine.json() == theirs.json()


def test_image_uploads_get_the_ports_answers(server: dict[str, Any]) -> None:
    """JPEG and PNG bodies, several connections at once, each decoded over its row (Pillow here: no GPU) and
    answered in the port's bytes; a body that is no image, or larger than a row, is refused as the port says."""
    uploads = garment_uploads(8)
    assert all(len(body) <= 784 for body in uploads)
    kinds = ["image/jpeg"] * 8 + ["image/png"] * 8

    def post(base: str, body: bytes, kind: str) -> httpx.Response:
        headers = {"content-type": kind, "authorization": f"Bearer {TOKEN}"}
        return httpx.post(base + "/predict", content=body, headers=headers, timeout=30)

    with ThreadPoolExecutor(8) as pool:
        mine = list(pool.map(lambda pair: post(server["door"], *pair), zip(uploads, kinds, strict=True)))
    theirs = [post(server["url"], body, kind) for body, kind in zip(uploads, kinds, strict=True)]
    for door, port in zip(mine, theirs, strict=True):
        assert door.status_code == port.status_code == 200, door.text
        got, want = door.json(), port.json()
        assert got["model"] == want["model"] and got["predictions"][0]["label"] == want["predictions"][0]["label"]
        # Other batch mates than the port's lone request: the scores of a batch, within float32's rounding.
        np.testing.assert_allclose(got["predictions"][0]["scores"], want["predictions"][0]["scores"], atol=1e-5)
    assert len({answer.json()["predictions"][0]["label"] for answer in mine}) > 3  # a mix-up would show
    not_an_image = b"\xff\xd8\xff" + b"junk" * 50
    door, port = post(server["door"], not_an_image, "image/jpeg"), post(server["url"], not_an_image, "image/jpeg")
    assert door.status_code == port.status_code == 422 and door.json() == port.json()
    larger = post(server["door"], uploads[0] + bytes(785 - len(uploads[0])), "image/jpeg")
    assert larger.status_code == 413 and "service's port" in larger.json()["error"]["message"]
    assert post(server["door"], uploads[1], "image/png").status_code == 200  # and it goes on


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        # A GET's empty body said with Content-Length: 0 is a GET (it was 405, "the route takes GET").
        (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"200", b""),
        (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", b"400", b"a GET with a body"),
        # A route the door does not serve is told so before its framing (it was 411, "send a Content-Length").
        (b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n", b"404", b"HTTP port"),
        (b"POST /nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"404", b"HTTP port"),
        (b"POST /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", b"405", b"takes GET"),
        # The v2 server metadata's refusal in the v2 protocol's error shape, as under /v2/ (a string, not an object)
        (b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n", b"401", b'{"error":"'),
    ],
)
def test_a_head_is_answered_for_what_it_asks_before_how_its_body_is_framed(
    server: dict[str, Any], request_bytes: bytes, status: bytes, says: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as connection:
        got, _, body = exchange(connection, request_bytes)
    assert got.startswith(b"HTTP/1.1 " + status + b" ") and says in body, (got, body)


def test_refusals_are_answers_on_the_connection(server: dict[str, Any]) -> None:
    image = sample_images(1)[0]
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as connection:  # one throughout
        status, _, body = exchange(connection, POST % (b"/predict", AUTH, 100) + b"\0" * 100)
        assert status.startswith(b"HTTP/1.1 422 "), (status, body)  # what it sent, as the service's port says
        assert orjson.loads(body)["error"]["message"] == "the body has 100 bytes, not one uint8 image (784 bytes)"
        status, _, body = exchange(connection, POST % (b"/v1/models/fashion-cnn/predict", AUTH, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 404 ") and b"HTTP port" in body, (status, body)
        for path in (b"/v2/models/fashion%2Dcnn/infer", b"/v2/models/fashion-cnn/versions//infer",
                     b"/v2/models//infer", b"/v2/models/fashion-cnn/inferx", b"/v2/models/.x/infer"):  # fmt: skip
            status, _, body = exchange(connection, POST % (path, AUTH, len(image)) + image)  # not a model's v2 infer
            assert status.startswith(b"HTTP/1.1 404 ") and b"HTTP port" in body, (path, status, body)
        status, _, body = exchange(connection, POST % (b"/v2/models/fashion-cnn/infer", AUTH, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 400 ") and b"Inference-Header-Content-Length" in body, (status, body)
        assert isinstance(orjson.loads(body)["error"], str)  # the protocol's shape, for Triton's clients
        garbled = AUTH + b"Inference-Header-Content-Length: abc\r\n"
        status, _, body = exchange(connection, POST % (b"/v2/models/fashion-cnn/infer", garbled, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 400 ") and b"is not a number of bytes" in body, (status, body)
        status, _, body = exchange(connection, b"GET /v2/models/nope HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
        assert status.startswith(b"HTTP/1.1 404 ") and b"metadata, configuration and readiness" in body, body
        status, _, _ = exchange(connection, POST % (b"/predict?layout=nhwc", AUTH, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 404 "), status
        json = POST.replace(b"application/octet-stream", b"application/json")
        status, _, body = exchange(connection, json % (b"/predict", AUTH, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 415 ") and b"octet-stream" in body, (status, body)
        assert orjson.loads(body)["error"]["message"] == "content type 'application/json' is not accepted here"
        # A type a client made up is shown as JSON may hold it: no quote, backslash or non-ASCII byte of it
        odd = POST.replace(b"application/octet-stream", b' text/"x\\y\xffz; charset=utf-8')
        status, _, body = exchange(connection, odd % (b"/predict", AUTH, len(image)) + image)
        assert orjson.loads(body)["error"]["message"] == "content type 'text/?x?y?z' is not accepted here", body
        untyped = POST.replace(b"Content-Type: application/octet-stream\r\n", b"")
        status, _, body = exchange(connection, untyped % (b"/predict", AUTH, len(image)) + image)
        assert orjson.loads(body)["error"]["message"] == "content type '(none)' is not accepted here", body
        gzipped = AUTH + b"Content-Encoding: gzip\r\n"  # tritonclient's request_compression_algorithm
        status, _, body = exchange(connection, POST % (b"/predict", gzipped, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 415 ") and b"Content-Encoding" in body and b"HTTP port" in body, body
        status, headers, body = exchange(connection, POST % (b"/predict", b"", len(image)) + image)
        assert status.startswith(b"HTTP/1.1 401 "), (status, headers)  # the port's challenge (app/errors.py)
        assert headers[b"www-authenticate"] == b'Bearer realm="cudagraph-serve"', headers
        assert b"no bearer token" in body and b"CGSERVE_AUTH_TOKENS" in body  # and what it expected
        wrong = b"Authorization: Bearer " + b"x" * len(TOKEN) + b"\r\n"
        status, headers, body = exchange(connection, POST % (b"/predict", wrong, len(image)) + image)
        assert status.startswith(b"HTTP/1.1 401 ") and b"not one of" in body, (status, body)
        assert headers[b"www-authenticate"] == b'Bearer realm="cudagraph-serve", error="invalid_token"', headers
        for given, challenge in ((b"", b'Bearer realm="cudagraph-serve"'),
                                 (wrong, b'Bearer realm="cudagraph-serve", error="invalid_token"')):  # fmt: skip
            status, headers, _ = exchange(connection, b"GET /v2/models/fashion-cnn HTTP/1.1\r\nHost: x\r\n" + given
                                          + b"\r\n")  # fmt: skip
            assert status.startswith(b"HTTP/1.1 401 ") and headers[b"www-authenticate"] == challenge, headers
        status, _, body = exchange(connection, POST % (b"/predict", AUTH, len(image)) + image)  # it goes on
        assert status.startswith(b"HTTP/1.1 200 ") and b'"predictions"' in body, (status, body)
        # The token as the service's ports read it: the scheme in any case, one or more spaces before it.
        for spaced in (b"Authorization: bearer  " + TOKEN.encode() + b"\r\n",
                       b"Authorization: Bearer \t" + TOKEN.encode() + b" \r\n"):  # fmt: skip
            status, _, body = exchange(connection, POST % (b"/predict", spaced, len(image)) + image)
            assert status.startswith(b"HTTP/1.1 200 "), (spaced, status, body)
            with socket.create_connection(("127.0.0.1", int(server["url"].rsplit(":", 1)[1])), timeout=5) as port:
                status, _, body = exchange(port, POST % (b"/predict", spaced, len(image)) + image)  # as the port
                assert status.startswith(b"HTTP/1.1 200 "), (spaced, status, body)
    for length in (b"-1", b"18446744073709551615", b"12abc", b""):  # refused, not read past the buffer
        with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as raw:
            raw.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 400 "), length
    refusals = {
        b"GET /predict HTTP/1.1\r\nHost: x\r\n\r\n": b"405",
        b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n": b"411",
        POST % (b"/predict", AUTH, 10**6): b"413",  # refused before the body is sent
    }
    for request, code in refusals.items():
        with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as raw:
            raw.sendall(request)
            answer = closed_within(raw, 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 " + code + b" "), (request, answer)
            assert b"connection: close" in answer
    # Another method: what its route takes, as the service's port says (Allow), or 404 where the door has no such
    # route.
    methods = {b"PUT /predict": (b"405", b"allow: POST\r\n"),
               b"PUT /v2/models/fashion-cnn/infer": (b"405", b"allow: POST\r\n"),
               b"DELETE /v2/models/fashion-cnn": (b"405", b"allow: GET\r\n"), b"PUT /nope": (b"404", b"")}  # fmt: skip
    for line, (code, allow) in methods.items():
        with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as raw:
            raw.sendall(line + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 0\r\n\r\n")
            answer = closed_within(raw, 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 " + code + b" "), (line, answer)
            assert (allow.lower() in answer.lower()) if allow else (b"allow:" not in answer.lower()), (line, answer)
            assert b"connection: close" in answer
    with httpx.Client(base_url=server["door"]) as client:
        predict(client, image)  # and the server still serves


def test_expect_continue_and_pipelined_requests(server: dict[str, Any]) -> None:
    image = sample_images(2)
    expect = b"Expect: 100-continue\r\n" + AUTH
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as connection:
        connection.sendall(POST % (b"/predict", expect, len(image[0])))
        assert connection.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        status, _, _ = exchange(connection, image[0])
        assert status.startswith(b"HTTP/1.1 200 ")
        two = b"".join(POST % (b"/predict", AUTH, len(one)) + one for one in image)  # both before either answer
        connection.sendall(two)
        both = b""  # the two answers, which one read may return together
        while both.count(b"HTTP/1.1 200 ") < 2 or not both.endswith(b"}"):
            chunk = connection.recv(65536)
            assert chunk, f"the connection was closed after {both[:400]!r}"
            both += chunk
    with httpx.Client(base_url=server["url"]) as client:
        alone = [predict(client, one)["predictions"][0]["label"] for one in image]
    first, second = both.split(b"HTTP/1.1 200 ")[1:]
    assert b'"label":%d' % alone[0] in first and b'"label":%d' % alone[1] in second, both


def test_a_pipelined_burst_larger_than_the_buffer_is_answered_in_order(server: dict[str, Any]) -> None:
    """64 requests sent at once (~60 KB, over four times a connection's 13 KB buffer): the door stops reading the
    socket while one is in flight with the buffer full, and takes up the rest after each answer, in order."""
    images = sample_images(4)
    burst = [images[i % 4] for i in range(64)]
    with httpx.Client(base_url=server["url"]) as client:
        alone = [predict(client, image)["predictions"][0]["label"] for image in images]
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=10) as connection:
        connection.sendall(b"".join(POST % (b"/predict", AUTH, len(one)) + one for one in burst))
        answers = read_answers(connection, len(burst))
    assert all(status.startswith(b"HTTP/1.1 200 ") for status, _, _ in answers), answers[0]
    labels = [orjson.loads(body)["predictions"][0]["label"] for _, _, body in answers]
    assert labels == [alone[i % 4] for i in range(len(burst))]


def test_idle_and_slow_connections_are_closed(server: dict[str, Any]) -> None:
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as idle:
        assert closed_within(idle, 4) == b""  # keepalive_timeout_s 1: closed quietly
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as slow:
        slow.sendall(POST % (b"/predict", AUTH, 784) + b"\0" * 100)  # and never the rest
        answer = closed_within(slow, 5)  # header_timeout_s + body_timeout_s: 2 s
        assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer


def test_connections_over_the_cap_get_503(server: dict[str, Any]) -> None:
    held = [socket.create_connection(("127.0.0.1", server["port"]), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # every one accepted
        with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as one_more:
            answer = closed_within(one_more, 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 503 "), answer
            assert b"too_many_connections" in answer
    finally:
        for connection in held:
            connection.close()
    time.sleep(0.5)  # their closes seen
    with httpx.Client(base_url=server["door"]) as client:
        predict(client, sample_images(1)[0])


def test_it_counts_into_metrics(server: dict[str, Any]) -> None:
    image = sample_images(1)[0]
    with httpx.Client(base_url=server["door"]) as client:
        time.sleep(1.5)  # the C side's refusals of the tests before are counted (every second), not among these
        before = settled_metrics(server["url"])
        for _ in range(3):
            predict(client, image)
        assert client.post("/predict", content=image, headers={"content-type": RAW["content-type"]}).status_code == 401
        assert client.post("/no/such/route", content=image, headers=RAW).status_code == 404
        assert client.post("/predict", content=image[:100], headers=RAW).status_code == 422
        # A v2 request the C side refuses before its parse (no Inference-Header-Content-Length): the protocol's
        assert client.post("/v2/models/fashion-cnn/infer", content=image, headers=RAW).status_code == 400
        time.sleep(1.5)  # the C side's refusals are counted every second
        after = settled_metrics(server["url"])

    # format too: a v2 test before this one has its own protocol="door" series (format="v2-binary")
    raw_ok = 'protocol="door",format="raw",code="200"'
    assert requests_counted(after, raw_ok) - requests_counted(before, raw_ok) == 3
    # the POST /predict without a token (a v2 request's 401 is counted under format="v2-binary")
    unauthorized = 'protocol="door",format="raw",code="401"'
    assert requests_counted(after, unauthorized) - requests_counted(before, unauthorized) >= 1
    assert 'cgserve_request_duration_seconds_count{format="raw",model="fashion-cnn",protocol="door"}' in after
    for reason in ("unauthorized", "invalid_route"):  # as the service's port counts its refusals

        def rejected(metrics: str, reason: str = reason) -> float:
            found = re.search(rf'^cgserve_rejections_total\{{model="",reason="{reason}"\}} (\S+)$', metrics, re.M)
            return float(found[1]) if found else 0.0

        assert rejected(after) - rejected(before) >= 1, reason
    # A body of the wrong length is the default model's, as the port counts it
    wrong = 'model="fashion-cnn",protocol="door",format="raw",code="422"'
    assert requests_counted(after, wrong) - requests_counted(before, wrong) == 1
    found = re.search(r'^cgserve_rejections_total\{model="fashion-cnn",reason="invalid_input"\} (\S+)$', after, re.M)
    assert found and float(found[1]) >= 1
    # counted under the v2 protocol's format, as its answers are (it was format="raw")
    v2_refused = 'model="",protocol="door",format="v2-binary",code="400"'
    assert requests_counted(after, v2_refused) - requests_counted(before, v2_refused) == 1
    raw_refused = 'model="",protocol="door",format="raw",code="400"'
    assert requests_counted(after, raw_refused) - requests_counted(before, raw_refused) == 0


def test_with_the_engine_process(tmp_path: Any) -> None:
    door_port = free_port()
    settings = {"device": "cpu", "workers": "2", "engine_process": "true", "front_door_port": str(door_port)}
    with running_server(tmp_path / "server.log", SERVE, **settings) as url:
        each_gets_its_own(f"http://127.0.0.1:{door_port}", url)
        one = load_test_sample()[0][:1].reshape(1, 1, 28, 28)  # and v2, answered in the engine process
        mine, theirs = triton_infer(f"http://127.0.0.1:{door_port}", one), triton_infer(url, one)
        assert mine.get_response() == theirs.get_response()
        np.testing.assert_array_equal(mine.as_numpy("probabilities"), theirs.as_numpy("probabilities"))


def test_the_door_stops_taking_connections_when_the_services_port_does(tmp_path: Any) -> None:
    """At the drain's end both ports stop taking connections, though the service's port still finishes a request
    it is reading: a client connecting to the door after that is not taken, where the door went on taking
    connections until the service's port had closed its last one (a walkthrough's find: up to 5 s longer, serving
    some, then accepting and resetting them)."""
    port, door_port = free_port(), free_port()
    argv = [*SERVE, "--port", str(port), "--grpc-port", "0", "--device", "cpu", "--front-door-port", str(door_port),
            "--drain-seconds", "1"]  # fmt: skip
    env = {"CGSERVE_BODY_TIMEOUT_S": "8", "CGSERVE_SHUTDOWN_TIMEOUT_S": "10"}
    with (
        running(argv, tmp_path / "server.log", port=port, cwd=ROOT, env=env) as process,
        socket.create_connection(("127.0.0.1", port), timeout=10) as reading,  # its request holds uvicorn's stop
    ):
        reading.sendall(b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
                        b"content-length: 784\r\n\r\n" + bytes(10))  # fmt: skip
        process.proc.send_signal(signal.SIGTERM)
        latest = time.monotonic() + 10
        while time.monotonic() < latest:  # until the service's port takes no connection
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                break
            time.sleep(0.05)
        time.sleep(0.2)  # the door is told on the event loop's next turn
        try:  # its SYN unanswered (app/ops/listening.py), as the service's port's are
            socket.create_connection(("127.0.0.1", door_port), timeout=1).close()
            taken = True
        except OSError:
            taken = False
        assert process.proc.poll() is None, "the server exited before the door was tried: nothing was tested"
        assert not taken, "the door took a connection after the service's port had stopped taking them"


def test_a_shutdown_still_answers_and_closes(tmp_path: Any) -> None:
    """SIGTERM with two keep-alive connections open on the door: once the service's port has stopped, a request
    on one is still answered, each connection is closed after, and the server exits."""
    port, door_port = free_port(), free_port()
    argv = [*SERVE, "--port", str(port), "--grpc-port", "0", "--device", "cpu", "--front-door-port", str(door_port),
            "--keepalive-timeout-s", "3", "--drain-seconds", "0"]  # fmt: skip
    image = sample_images(1)[0]
    with running(argv, tmp_path / "server.log", port=port, cwd=ROOT) as process:
        with socket.create_connection(("127.0.0.1", door_port), timeout=10) as busy, \
             socket.create_connection(("127.0.0.1", door_port), timeout=10) as idle:  # fmt: skip
            # Each answered once first: the door has taken both (a connection still in the listener's backlog at the
            # SIGTERM is never taken, and is reset: CI's busy machine did that once).
            request = POST % (b"/predict", b"", len(image)) + image
            for connection in (busy, idle):
                assert exchange(connection, request)[0].startswith(b"HTTP/1.1 200")
            process.proc.send_signal(signal.SIGTERM)
            latest = time.monotonic() + 10
            while time.monotonic() < latest:  # until uvicorn has closed the service's port
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    break
                time.sleep(0.05)
            status, _, body = exchange(busy, request)
            assert status.startswith(b"HTTP/1.1 200 ") and b'"predictions"' in body, (status, body)
            assert closed_within(busy, 6) == b""
            assert closed_within(idle, 6) == b""
        assert process.proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn raises the signal again once done


def test_garbage_never_takes_it_down(server: dict[str, Any]) -> None:
    """Random bytes, cut-off requests, junk headers and abrupt closes on many connections at once: each gets an
    answer or a close, and afterwards the door still answers every image right."""
    rng = np.random.default_rng(7)
    image = sample_images(1)[0]
    good = POST % (b"/predict", AUTH, len(image)) + image
    shapes = [
        lambda: rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes(),  # noise
        lambda: good[: int(rng.integers(1, len(good)))],  # cut anywhere
        lambda: good.replace(b"Content-Length: 784", b"Content-Length: 784\r\nContent-Length: 7"),
        lambda: good.replace(b"Host: x", b"Host: x\r\n" + b"X-Junk: " + b"a" * int(rng.integers(1, 9000))),
        lambda: good.replace(b"\r\n", b"\n"),  # bare newlines: no head end is found
        lambda: good * int(rng.integers(2, 5)),  # pipelined, then closed before the answers
        lambda: b"POST /predict HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
    ]

    def hostile(index: int) -> None:
        with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as raw:
            try:
                raw.sendall(shapes[index % len(shapes)]())
                if index % 3:
                    raw.recv(4096)  # sometimes read a little, sometimes leave at once
            except OSError:
                pass  # refused and closed under us: fine

    with ThreadPoolExecutor(MAX_CONNECTIONS - 2) as pool:
        list(pool.map(hostile, range(200)))
    time.sleep(0.5)  # the closes seen
    each_gets_its_own(server["door"], server["url"])


def test_what_hostile_or_odd_clients_send(server: dict[str, Any]) -> None:
    """Each case a review of door.c found (run 35's session): answered as HTTP says, or refused and closed."""
    image = sample_images(1)[0]
    good = POST % (b"/predict", AUTH, len(image)) + image

    def answer_then_close(request: bytes, half_close: bool = False) -> bytes | None:
        with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as raw:
            raw.sendall(request)
            if half_close:
                raw.shutdown(socket.SHUT_WR)
            return closed_within(raw, 5)

    # A request, then the client's last byte: still answered, then closed.
    answer = answer_then_close(good, half_close=True)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200 ") and b'"predictions"' in answer, answer
    # Two requests pipelined before that last byte: both answered.
    answer = answer_then_close(good * 2, half_close=True)
    assert answer is not None and answer.count(b"HTTP/1.1 200 ") == 2, answer
    # Two Content-Lengths (a proxy before us may read the other: request smuggling).
    twice = good.replace(b"Content-Length: 784", b"Content-Length: 784\r\nContent-Length: 4")
    answer = answer_then_close(twice)
    assert answer is not None and answer.startswith(b"HTTP/1.1 400 ") and b"two Content-Length" in answer
    # A head over 8 KiB that arrives in one read.
    big = good.replace(b"Host: x", b"Host: x\r\nX-Pad: " + b"a" * 9000)
    answer = answer_then_close(big)
    assert answer is not None and answer.startswith(b"HTTP/1.1 431 "), answer
    # A header hidden behind a bare LF; a head of bare LF lines alone, which never ends in CRLF CRLF (it waited for
    # request_s, then got 408).
    bare = good.replace(b"Host: x\r\n", b"Host: x\nX-Other: y\r\n")
    for request in (bare, b"GET /v2 HTTP/1.1\nHost: a\n\n"):
        started = time.monotonic()
        answer = answer_then_close(request)
        assert answer is not None and answer.startswith(b"HTTP/1.1 400 ") and b"bare LF" in answer, answer
        assert time.monotonic() - started < 1.5, request
    # What a proxy before the door could read otherwise than the door does (a second review, run 37's session):
    # a header with a space before its colon, a folded line, a bare CR, a line without a colon, a control
    # character, another HTTP version, two Hosts. Each is refused whole and the connection closed.
    smuggled = {
        b"Transfer-Encoding : chunked\r\n": b"colon",
        b"Content-Length : 5\r\n": b"colon",
        b"X-A: 1\r\n Transfer-Encoding: chunked\r\n": b"folded",
        b"X-A: 1\rTransfer-Encoding: chunked\r\n": b"bare CR",
        b"X-No-Colon\r\n": b"colon",
        b"X-A: a\0b\r\n": b"control character",
        b"Host: y\r\n": b"two Host",
        b"Authorization: Bearer wrong\r\n": b"two Authorization",  # a walkthrough's find: the first was read
    }
    for extra, said in smuggled.items():
        answer = answer_then_close(POST % (b"/predict", AUTH + extra, len(image)) + image)
        assert answer is not None and answer.startswith(b"HTTP/1.1 400 ") and said in answer, (extra, answer)
    answer = answer_then_close(good.replace(b"HTTP/1.1\r\n", b"HTTP/7.7\r\n", 1))
    assert answer is not None and answer.startswith(b"HTTP/1.1 400 ") and b"request line" in answer, answer
    # HTTP/1.1 without a Host (RFC 9112: 400, as the service's port answers); HTTP/1.0 may leave it out.
    answer = answer_then_close(good.replace(b"Host: x\r\n", b"", 1))
    assert answer is not None and answer.startswith(b"HTTP/1.1 400 ") and b"no Host" in answer, answer
    answer = answer_then_close(good.replace(b"Host: x\r\n", b"", 1).replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1))
    assert answer is not None and b" 200 " in answer.split(b"\r\n", 1)[0], answer
    # A v2 request whose inference header is 0 bytes long: refused, not answered as a POST /predict.
    empty = POST % (b"/v2/models/fashion-cnn/infer", AUTH + b"Inference-Header-Content-Length: 0\r\n", len(image))
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=5) as raw:
        status, _, body = exchange(raw, empty + image)
    assert status.startswith(b"HTTP/1.1 400 ") and b"is 0" in body, (status, body)
    # Expect: 100-continue without a token: refused before the body is sent, not invited to send it.
    head = POST % (b"/predict", b"Expect: 100-continue\r\n", len(image))
    answer = answer_then_close(head)
    assert answer is not None and answer.startswith(b"HTTP/1.1 401 "), answer
    # Refusals pipelined by a client that does not read: the answers it gets are never a stream with holes in
    # it — every answer whole, or the connection closed after the last one it could take.
    refused = POST % (b"/elsewhere", AUTH, 0)
    with socket.socket() as raw:
        # A small receive buffer, set before connecting. Set after, the window it left stayed under loopback's
        # 64 KiB segment even once widened, and reading what the server had written took 1 s in most of 25 tries,
        # 10 s or 100 s in the rest (the backoff of the sender's zero-window probes, by the look of it); set
        # before, 0.03 s every time.
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(10)
        raw.connect(("127.0.0.1", server["port"]))
        sender = ThreadPoolExecutor(1).submit(lambda: raw.sendall(refused * 20000))
        time.sleep(2)  # the server writes what it can while nobody reads
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # then what it wrote (~3 MB) is read at once
        data = closed_within(raw, 10)
        with contextlib.suppress(OSError):
            sender.result(timeout=10)
    assert data is not None, "the connection is still open: answers were dropped from a stream that goes on"
    whole = data.count(b"HTTP/1.1 404 ")
    assert whole >= 1 and (whole == 20000 or data.rfind(b"HTTP/1.1 404 ") > len(data) - 2000), whole


def triton_infer(url: str, images: np.ndarray, **asked: Any) -> triton_http.InferResult:
    """Triton's own HTTP client: one UINT8 image, its output as `asked` (binary_data, class_count)."""
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as client:
        tensor = triton_http.InferInput("input", list(images.shape), "UINT8")
        tensor.set_data_from_numpy(images, binary_data=True)
        wanted = [triton_http.InferRequestedOutput("probabilities", **asked)]
        return client.infer("fashion-cnn", [tensor], outputs=wanted, headers={"authorization": f"Bearer {TOKEN}"},
                            request_id="r-1")  # fmt: skip


def test_triton_clients_get_the_http_ports_v2_answers(server: dict[str, Any]) -> None:
    """tritonclient's v2 infer of one UINT8 image, binary or JSON out, top-k or probabilities: the door answers
    what the HTTP port does, to the byte."""
    images = load_test_sample()[0][:6].reshape(6, 1, 28, 28)  # uint8 pixels
    for i, asked in enumerate([{"binary_data": True}, {"binary_data": False}, {"class_count": 3}] * 2):
        one = images[i : i + 1]
        mine, theirs = triton_infer(server["door"], one, **asked), triton_infer(server["url"], one, **asked)
        assert mine.get_response() == theirs.get_response()
        np.testing.assert_array_equal(mine.as_numpy("probabilities"), theirs.as_numpy("probabilities"))
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8",
                                       "parameters": {"binary_data_size": 784}}],
                           "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]})  # fmt: skip
    body = header + images[0].tobytes()
    head = {"inference-header-content-length": str(len(header)), "authorization": f"Bearer {TOKEN}"}
    with httpx.Client() as client:
        mine = client.post(server["door"] + "/v2/models/fashion-cnn/infer", content=body, headers=head)
        theirs = client.post(server["url"] + "/v2/models/fashion-cnn/infer", content=body, headers=head)
    assert mine.status_code == theirs.status_code == 200 and mine.content == theirs.content
    for name in ("content-type", "inference-header-content-length"):
        assert mine.headers[name] == theirs.headers[name]
    with triton_http.InferenceServerClient(server["door"].removeprefix("http://")) as door, \
         triton_http.InferenceServerClient(server["url"].removeprefix("http://")) as port:  # fmt: skip
        auth = {"authorization": f"Bearer {TOKEN}"}
        for call in ("get_model_metadata", "get_model_config", "is_model_ready"):
            mine, theirs = (
                getattr(door, call)("fashion-cnn", headers=auth),
                getattr(port, call)("fashion-cnn", headers=auth),
            )
            assert mine == theirs, call
        assert door.get_server_metadata(headers=auth) == port.get_server_metadata(headers=auth)
        assert door.is_server_live() and door.is_server_ready()
        with pytest.raises(InferenceServerException) as refused:
            door.get_model_metadata("fashion-cnn")  # no token
        assert refused.value.status() == "401"
        with pytest.raises(InferenceServerException, match="HTTP port") as refused:
            door.get_model_repository_index(headers=auth)  # a POST the HTTP port has


def test_v2_requests_the_door_does_not_take_are_refused_as_the_protocol_says(server: dict[str, Any]) -> None:
    """FP32 (four times the bytes), a header the HTTP port refuses, and a model not served: a v2 error Triton's
    client reads, each saying what to send instead (or, for the model, what the port says); the door goes on."""
    images = load_test_sample()[0][:1].reshape(1, 1, 28, 28)
    with triton_http.InferenceServerClient(server["door"].removeprefix("http://")) as client:
        auth = {"authorization": f"Bearer {TOKEN}"}
        fp32 = triton_http.InferInput("input", [1, 1, 28, 28], "FP32")
        fp32.set_data_from_numpy(images.astype(np.float32) / 255, binary_data=True)
        with pytest.raises(InferenceServerException, match="UINT8") as refused:
            client.infer("fashion-cnn", [fp32], headers=auth)
        assert refused.value.status() == "400"
        wrong = triton_http.InferInput("input", [1, 1, 28, 28], "UINT8")
        wrong.set_data_from_numpy(images, binary_data=True)
        with pytest.raises(InferenceServerException, match="logits") as refused:
            client.infer("fashion-cnn", [wrong], outputs=[triton_http.InferRequestedOutput("logits")], headers=auth)
        assert refused.value.status() == "400"
        with pytest.raises(InferenceServerException, match="other") as refused:  # the port's words: no such model
            client.infer("other", [wrong], headers=auth)
        assert refused.value.status() == "404"
        assert client.infer("fashion-cnn", [wrong], headers=auth).as_numpy("probabilities").shape == (1, 10)


def test_its_v2_gets_follow_the_model_unloaded_and_loaded_again(tmp_path: Any) -> None:
    """The door's GET answers are set afresh each second: once the model is unloaded (model control), they say
    what the HTTP port says (404); loaded again, its metadata and inference come back through the door."""
    door_port = free_port()
    settings = {"device": "cpu", "front_door_port": str(door_port), "model_control": "explicit"}
    with running_server(tmp_path / "server.log", SERVE, **settings) as url:
        door = triton_http.InferenceServerClient(f"127.0.0.1:{door_port}")
        port = triton_http.InferenceServerClient(url.removeprefix("http://"))

        def door_metadata() -> int:
            try:
                door.get_model_metadata("fashion-cnn")
            except InferenceServerException as refused:
                return int(refused.status() or 0)
            return 200

        def within(seconds: float, status: int) -> bool:
            latest = time.monotonic() + seconds
            while door_metadata() != status and time.monotonic() < latest:
                time.sleep(0.1)
            return door_metadata() == status

        assert door_metadata() == 200
        port.unload_model("fashion-cnn")
        assert within(3, 404)
        with pytest.raises(InferenceServerException, match="fashion-cnn"):
            door.get_model_config("fashion-cnn")
        port.load_model("fashion-cnn")
        assert within(3, 200)
        images = load_test_sample()[0][:1].reshape(1, 1, 28, 28)
        tensor = triton_http.InferInput("input", [1, 1, 28, 28], "UINT8")
        tensor.set_data_from_numpy(images, binary_data=True)
        assert door.infer("fashion-cnn", [tensor]).as_numpy("probabilities").shape == (1, 10)
        door.close()
        port.close()


def test_the_open_file_limit_refuses_and_recovers(tmp_path: Any) -> None:
    """Past the process's open-file limit (a server under `ulimit -n 256`, a connection cap above it), each
    connection more gets a 503 and is closed, rather than waiting in the backlog while every door thread
    wakes for it again and again; once they go, the door serves again."""
    door_port = free_port()
    serve = ("sh", "-c", f"ulimit -n 256 && exec {sys.executable} -m app.cli serve")
    settings = {"device": "cpu", "front_door_port": str(door_port), "max_connections": "4000"}
    with running_server(tmp_path / "server.log", serve, **settings) as url:
        held = [socket.create_connection(("127.0.0.1", door_port), timeout=10) for _ in range(400)]
        try:
            for connection in held:
                connection.setblocking(False)
            refused: set[int] = set()
            latest = time.monotonic() + 20  # until the door has refused what it cannot accept
            while len(refused) <= 100 and time.monotonic() < latest:
                time.sleep(0.2)
                for i, connection in enumerate(held):
                    try:
                        answer = connection.recv(4096)
                    except (BlockingIOError, OSError):
                        continue  # accepted, and waiting for its request (or read already)
                    if answer.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in answer:
                        refused.add(i)
            assert len(refused) > 100, len(refused)  # ~250 descriptors less the server's own: most of 400 refused
        finally:
            for connection in held:
                connection.close()
        time.sleep(1)
        each_gets_its_own(f"http://127.0.0.1:{door_port}", url)


def test_a_client_that_never_reads_is_given_up(server: dict[str, Any]) -> None:
    """A client that pipelines requests and never reads an answer (a 4 KiB receive buffer): once its answers
    fill the socket, the door waits request_s (2 s here) for it to read, then closes the connection, rather
    than hold its buffers for good; the door goes on serving."""
    image = sample_images(1)[0]
    requests = (POST % (b"/predict", AUTH, len(image)) + image) * 16
    with socket.socket() as greedy:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        greedy.connect(("127.0.0.1", server["port"]))
        greedy.settimeout(0.5)
        latest, ended = time.monotonic() + 30, None
        while ended is None and time.monotonic() < latest:
            try:
                greedy.send(requests)
            except TimeoutError:
                continue  # its buffers are full: the door stopped reading while its answers wait
            except OSError as error:  # reset or broken pipe: the door gave the connection up
                ended = error
        assert ended is not None, "the door still held a connection that never read, 30 s on"
    with httpx.Client(base_url=server["door"]) as client:
        predict(client, image)


@contextlib.contextmanager
def door_alone(shape: tuple[int, int, int], *, threads: int, full_rows: int, max_connections: int,
               max_pixels: int = 2**20, buffers: int = 3, max_bytes: int = 2**24
               ) -> Iterator[tuple[Any, tuple[str, int]]]:  # fmt: skip
    """door.c on a port of its own, without a server: (the Door, its address); the test plays the feeder. The
    library CGSERVE_FRONT_DOOR_LIBRARY names where it is set (a sanitizer's build), as the servers here take it."""
    from app.front_door.door import Door, Limits
    from app.front_door.library import door_library

    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    limits = Limits(max_connections=max_connections, keepalive_s=5, request_s=5, tokens=(), max_bytes=max_bytes,
                    max_pixels=max_pixels)  # fmt: skip
    configured = os.environ.get("CGSERVE_FRONT_DOOR_LIBRARY")
    library = door_library(Path(configured) if configured else None)
    door = Door(library, listener, threads=threads, shape=shape, buffers=buffers, wake_fd=wake, path=b"/predict",
                full_rows=full_rows, limits=limits)  # fmt: skip
    try:
        yield door, listener.getsockname()
    finally:
        door.close()
        listener.close()
        os.close(wake)


def taken_ids(door: Any, count: int, seconds: float = 5.0) -> list[int]:
    """The ids of the next `count` requests the door holds: its bulks taken, each given back at once, until it has
    them or `seconds` pass (fewer then)."""
    ids: list[int] = []
    latest = time.monotonic() + seconds
    while len(ids) < count and time.monotonic() < latest:
        bulk = door.take()
        if bulk is None:
            time.sleep(0.0002)
            continue
        ids += bulk.ids.tolist()
        door.release(bulk.buffer)
    return ids


def test_the_most_buffers_the_settings_ask_for_open_the_door() -> None:
    """server.py's door_buffers at the largest CGSERVE_IN_FLIGHT and CGSERVE_JPEG_LAUNCHES, with the GPU decoder's
    share: door.c takes them (in_flight at 16 once stopped the server's start-up: "the front door refused … 17
    buffers")."""
    from annotated_types import Le

    from app.config import Settings
    from app.front_door.server import door_buffers

    def largest(name: str) -> int:
        (most,) = (limit.le for limit in Settings.model_fields[name].metadata if isinstance(limit, Le))
        return int(most)

    settings = Settings(in_flight=largest("in_flight"))
    buffers = door_buffers(settings, paced_launches=largest("jpeg_launches"))
    with door_alone((1, 28, 28), threads=1, full_rows=8, max_connections=8, buffers=buffers) as (door, address):
        connection = socket.create_connection(address, timeout=5)
        connection.sendall(POST % (b"/predict", b"", 784) + bytes(784))
        ids = taken_ids(door, 1)
        connection.close()
        assert len(ids) == 1, "the request never reached a bulk"


def test_answers_handed_over_while_the_thread_has_not_yet_written_the_last_ones_all_go_out() -> None:
    """door.c wakes a thread only where its outbox was empty: answers added before it took the outbox ride on the
    wake already given. Round after round, 32 connections of two threads answered in calls of random sizes back to
    back, while the threads write: every answer arrives (a wake lost leaves one waiting, and its read times out;
    a build that read the eventfd after taking the outbox hung within a few dozen rounds)."""
    rng = np.random.default_rng(0)
    request = POST % (b"/predict", b"", 784) + bytes(784)
    with door_alone((1, 28, 28), threads=2, full_rows=64, max_connections=64) as (door, address):
        connections = [socket.create_connection(address, timeout=5) for _ in range(32)]
        try:
            for round_ in range(200):
                for connection in connections:
                    connection.sendall(request)
                ids = taken_ids(door, len(connections))
                assert len(ids) == len(connections), f"round {round_}: not every request reached a bulk"
                start = 0
                while start < len(ids):
                    some = np.array(ids[start : start + int(rng.integers(1, 5))], np.uint64)
                    door.answer(some, [b"%d" % i for i in some.tolist()], b"200 OK",
                                [b"content-type: text/plain\r\n"] * len(some))  # fmt: skip
                    start += len(some)
                try:
                    answered = sorted(int(read_answer(connection)[2]) for connection in connections)
                except TimeoutError:
                    pytest.fail(f"round {round_}: an answer handed to the door never went out")
                assert answered == sorted(ids)  # each connection its own request's answer
        finally:
            for connection in connections:
                connection.close()


def test_a_body_larger_than_the_whole_budget_is_413_not_a_503_for_ever() -> None:
    """One image's body where CGSERVE_MAX_INFLIGHT_BYTES is less than one image: no retry could fit it."""
    with (
        door_alone((1, 28, 28), threads=1, full_rows=8, max_connections=8, max_bytes=512) as (_, address),
        socket.create_connection(address, timeout=5) as connection,
    ):
        connection.sendall(POST % (b"/predict", b"", 784) + bytes(784))
        status, _, body = read_answer(connection)
    assert status.startswith(b"HTTP/1.1 413") and b"CGSERVE_MAX_INFLIGHT_BYTES" in body, (status, body)


def test_an_answer_given_twice_reaches_nobody() -> None:
    """An id names one request, not its connection: a second answer for it, arriving while the connection's next
    request is in flight, is dropped, and that request gets its own (door.c alone, Python as the feeder)."""
    with door_alone((1, 28, 28), threads=1, full_rows=8, max_connections=8) as (door, address):

        def taken() -> np.ndarray:
            ids = taken_ids(door, 1)
            assert ids, "the request never reached a bulk"
            return np.array(ids, np.uint64)

        def answer(ids: np.ndarray, body: bytes) -> None:
            door.answer(ids, [body], b"200 OK", [b"content-type: text/plain\r\n"])

        request = POST % (b"/predict", b"", 784) + bytes(784)
        with socket.create_connection(address, timeout=5) as connection:
            connection.sendall(request)
            first = taken()
            answer(first, b"first")
            assert read_answer(connection)[2] == b"first"
            connection.sendall(request)
            second = taken()
            answer(first, b"first, again")  # before the fix: written as the second request's answer
            answer(second, b"second")
            assert read_answer(connection)[2] == b"second"


def test_it_tells_the_jpegs_nvjpeg_takes_from_those_pillow_decodes() -> None:
    """door.c's own test for the GPU (app/codecs/uploads.py's gpu_decodable, in C): a whole baseline or progressive
    JPEG of grey or YCbCr within the pixel limit (and, progressive, the scan limit) is a JPEG row; a PNG, a CMYK
    JPEG, one cut short, one over a limit, or junk after a JPEG's first marker is an IMAGE row, for Pillow. Each
    row starts with its body's bytes; a body over a row's bytes is refused 413 (door.c alone, Python as the
    feeder)."""
    from app.front_door.door import IMAGE, JPEG

    y, x = np.indices((64, 64))
    photo = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).astype(np.uint8)  # (64, 64, 3): colour, small encoded
    rgb = encoded(photo, "JPEG", quality=75)
    cmyk = io.BytesIO()
    Image.fromarray(photo).convert("CMYK").save(cmyk, "JPEG")
    flat = np.full((128, 128), 100, np.uint8)
    expected = {
        rgb: JPEG,
        encoded(photo[..., 0], "JPEG", quality=75): JPEG,  # grey
        encoded(photo, "JPEG", quality=75, progressive=True): JPEG,
        scan_bomb(MAX_JPEG_SCANS, side=64): JPEG,  # progressive, at the scan limit
        scan_bomb(MAX_JPEG_SCANS + 1, side=64): IMAGE,  # over it: Pillow's path, which refuses it
        with_scan_markers_before_its_frame(scan_bomb(10, side=64), MAX_JPEG_SCANS + 50): JPEG,  # not its scans
        scan_bomb_hiding_its_frame(MAX_JPEG_SCANS + 1, side=64): IMAGE,  # an RST before its frame hides nothing
        encoded(flat[:64, :64], "JPEG"): JPEG,  # 4,096 pixels: at the limit
        encoded(flat, "JPEG"): IMAGE,  # 16,384: over it
        encoded(photo, "PNG"): IMAGE,
        cmyk.getvalue(): IMAGE,
        rgb[: len(rgb) * 2 // 3]: IMAGE,  # no end-of-image marker
        b"\xff\xd8\xff" + b"junk" * 50: IMAGE,
        # Each ends in an EOI, so the marker walk decides: fill bytes to the end, a frame header cut short, a scan
        # before any frame, a marker whose length is under 2.
        b"\xff\xd8" + b"\xff" * 20 + b"\xff\xd9": IMAGE,
        b"\xff\xd8\xff\xc0\x00\x11\x08\x00\xff\xd9": IMAGE,
        b"\xff\xd8\xff\xda\x00\x02\xff\xd9": IMAGE,
        b"\xff\xd8\xff\xe0\x00\x01\xff\xd9": IMAGE,
    }
    assert all(len(body) <= 3 * 64 * 64 for body in expected)
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
    with (
        door_alone((3, 64, 64), threads=2, full_rows=64, max_connections=32, max_pixels=64 * 64) as (door, address),
        contextlib.ExitStack() as stack,
    ):
        connections = [stack.enter_context(socket.create_connection(address, timeout=5)) for _ in expected]
        for connection, body in zip(connections, expected, strict=True):
            kind = b"image/png" if body.startswith(b"\x89PNG") else b"image/jpeg"
            connection.sendall(head % (kind, len(body)) + body)
        found: dict[bytes, int] = {}
        latest = time.monotonic() + 10
        while len(found) < len(expected) and time.monotonic() < latest:
            bulk = door.take()
            if bulk is None:
                time.sleep(0.01)
                continue
            assert bulk.kinds is not None and bulk.lengths is not None
            for row, kind, length in zip(bulk.rows, bulk.kinds.tolist(), bulk.lengths.tolist(), strict=True):
                found[row.reshape(-1)[:length].tobytes()] = kind
            door.answer(bulk.ids, [b"ok"] * len(bulk.ids), b"200 OK", [b"content-type: text/plain\r\n"] * len(bulk.ids))
            door.release(bulk.buffer)
        assert found == expected
        with socket.create_connection(address, timeout=5) as connection:
            status, _, body = exchange(connection, head % (b"image/jpeg", 3 * 64 * 64 + 1) + bytes(3 * 64 * 64 + 1))
            assert status.startswith(b"HTTP/1.1 413 ") and b"service's port" in body, (status, body)


def door_requests(metrics: str) -> float:
    """Every cgserve_requests_total series of the door's, summed."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("cgserve_requests_total{") and 'protocol="door"' in line)  # fmt: skip


def test_a_lookup_it_refuses_is_not_counted_as_a_request(server: dict[str, Any]) -> None:
    """The HTTP port counts no GET of metadata or readiness among its requests; each such GET of a model the door
    does not serve added a v2 request's 404 and an invalid_route rejection (a review)."""
    with httpx.Client(base_url=server["door"]) as client:
        time.sleep(1.5)  # the C side's refusals of the tests before are counted (every second), not among these
        before = settled_metrics(server["url"])
        for i in range(5):
            token = {"authorization": RAW["authorization"]}
            assert client.get(f"/v2/models/no-such-model-{i}", headers=token).status_code == 404
            assert client.get("/v2/models/fashion-cnn").status_code == 401  # no token
        time.sleep(1.5)  # the C side's refusals are counted every second
        after = settled_metrics(server["url"])
    assert door_requests(after) == door_requests(before)
