"""Hostile and broken clients are answered as they should be, and normal traffic beside them is served.

Against the real server on the CPU, normal load while each attack runs: slowloris (headers a byte at a
time), oversized headers, half-sent bodies, uploads at the largest allowed image size; then clients that
disconnect mid-request.

Issue 11's target is ≥ 80 % of the throughput. That is a speed figure, and speed lives in records,
not in assertions on a shared 2-core machine (these runs measured 77–109 %; before the fixes two
clients sending large PNGs cut it to 2 %, 1,977 → 38 req/s): each run records its share
(bench/reliability_figures.py keeps them; bench/results/2026-11-30-cpu-reliability.md the earlier
ones), and the same load without the attack, before and after, runs only then: it gives the figure's
baseline and tests nothing. What a test holds on any machine is behaviour: every normal request answered
200 while the attack runs, and the attackers get their 431, 408 or closed connection.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.server_process import running_server
from tests.reliability.common import PINNED_SERVE, loadtest, on_client_core, record_figure, recording_figures

TIMEOUTS = {"header_timeout_s": "2", "body_timeout_s": "2", "keepalive_timeout_s": "2"}
NORMAL = ["--form", "raw", "--batch", "4", "--concurrency", "8", "--warmup", "1", "--duration", "6"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    with running_server(log, command=PINNED_SERVE, device="cpu", **TIMEOUTS) as url:
        yield url


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def throughput(url: str, out: Path) -> float:
    record = loadtest(out, "--url", url, *NORMAL)
    assert record["counts"]["errors"] == 0, record["summary"]  # every normal request answered 200
    assert record["counts"]["ok"] > 0, record["summary"]  # and some were: the attack starved nothing
    return float(record["throughput_rps"])


def under_attack(url: str, tmp_path: Path, attack: Callable[[threading.Event], None], threads: int) -> None:
    """Normal traffic, every request answered 200, while `threads` attackers run; when figures are recorded,
    its throughput as a share of it without them (the mean of a run just before and one just after: the
    machine's own drift cancels)."""
    recording = recording_figures()
    before = throughput(url, tmp_path / "before.json") if recording else 0.0
    stop = threading.Event()

    def pinned_attack(stop: threading.Event) -> None:
        on_client_core()
        attack(stop)

    attackers = [threading.Thread(target=pinned_attack, args=(stop,), daemon=True) for _ in range(threads)]
    for attacker in attackers:
        attacker.start()
    try:
        attacked = throughput(url, tmp_path / "attacked.json")
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join(timeout=15)
    if not recording:
        return
    after = throughput(url, tmp_path / "after.json")
    share = attacked / ((before + after) / 2)  # issue 11's target: ≥ 0.8
    record_figure(attack.__name__, attacked_rps=attacked, before_rps=before, after_rps=after, share=share)


def test_slowloris_connections_are_closed_and_cost_nothing(server: str, tmp_path: Path) -> None:
    closed_by_server: list[float] = []

    def slowloris(stop: threading.Event) -> None:
        while not stop.is_set():
            with socket.create_connection(address(server)) as sock:
                sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
                started = time.monotonic()
                try:
                    while not stop.is_set():  # a header byte every half second, never finishing
                        sock.sendall(b"X")
                        if stop.wait(0.5):
                            return
                except OSError:
                    closed_by_server.append(time.monotonic() - started)

    under_attack(server, tmp_path, slowloris, threads=50)
    assert closed_by_server, "the server closed no slowloris connection"
    record_figure("slowloris_closed", slowest_close_s=max(closed_by_server))  # the 2 s header timeout; was < 4


def test_oversized_headers_get_431_cheaply(server: str, tmp_path: Path) -> None:
    answers: list[bytes] = []

    def huge_headers(stop: threading.Event) -> None:
        while not stop.is_set():
            with socket.create_connection(address(server)) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
                try:
                    for _ in range(200):  # up to 200 × 64 KB: the server must stop reading long before
                        sock.sendall(b"a" * 65536)
                except OSError:
                    pass
                answers.append(sock.recv(200))
            stop.wait(0.1)  # ten refused heads a second per thread: the refusal is what is measured

    under_attack(server, tmp_path, huge_headers, threads=2)
    assert answers and all(answer.startswith(b"HTTP/1.1 431") for answer in answers if answer), answers[:3]


def test_half_sent_bodies_get_408_and_cost_nothing(server: str, tmp_path: Path) -> None:
    answers: list[bytes] = []

    def half_bodies(stop: threading.Event) -> None:
        while not stop.is_set():
            with socket.create_connection(address(server)) as sock:
                head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                sock.sendall(head + b"Content-Length: 100000\r\n\r\n" + b"\0" * 20)  # then nothing
                sock.settimeout(10)
                try:
                    answers.append(sock.recv(300))
                except OSError:
                    answers.append(b"")

    under_attack(server, tmp_path, half_bodies, threads=20)
    assert answers and all(b" 408 " in answer for answer in answers), answers[:3]


def test_uploads_of_the_largest_allowed_images_beside_normal_traffic(server: str, tmp_path: Path) -> None:
    noise = np.random.default_rng(0).integers(0, 256, (1024, 1024), dtype=np.uint8)  # 1 MP: the seed's limit
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="PNG")
    png = buffer.getvalue()
    statuses: list[int] = []

    def uploads(stop: threading.Event) -> None:
        with httpx.Client(base_url=server, timeout=30, trust_env=False) as client:
            while not stop.is_set():
                statuses.append(client.post("/predict", files={"file": ("big.png", png, "image/png")}).status_code)

    under_attack(server, tmp_path, uploads, threads=1)
    assert statuses and set(statuses) == {200}
    too_big = Image.fromarray(np.zeros((1025, 1024), dtype=np.uint8))
    buffer = io.BytesIO()
    too_big.save(buffer, format="PNG")
    refused = httpx.post(f"{server}/predict", files={"file": ("x.png", buffer.getvalue(), "image/png")})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "image_too_large"


def test_clients_that_disconnect_are_counted_as_client_closed_not_errors(server: str) -> None:
    def rejections() -> dict[str, float]:
        return {
            sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(httpx.get(f"{server}/metrics").text)
            for sample in family.samples
            if sample.name == "cgserve_rejections_total"
        }

    closed_before = rejections().get("client_closed", 0)
    for _ in range(5):  # mid-body: the declared length never arrives
        with socket.create_connection(address(server)) as sock:
            head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            sock.sendall(head + b"Content-Length: 7840\r\n\r\n" + b"\0" * 100)
            # Kept: the client holds the half-sent request open a moment, so the server is reading
            # its body (not its head) when it goes: the behaviour under test.
            time.sleep(0.05)
    deadline = time.monotonic() + 10  # the server counts each once it sees the connection gone
    while (reasons := rejections()).get("client_closed", 0) < closed_before + 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reasons.get("client_closed", 0) >= closed_before + 5, reasons
    assert reasons.get("engine_error", 0) == 0, reasons
    assert (
        httpx.post(
            f"{server}/predict", content=bytes(784), headers={"content-type": "application/octet-stream"}
        ).status_code
        == 200
    )
