"""gRPC connections are bounded as HTTP's are (issue 24.6): 1,000 idle connections (a preface each)
held 1,023 of the server's 1,024 descriptors. An idle one is now closed after
CGSERVE_KEEPALIVE_TIMEOUT_S (a GOAWAY, then the close)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from loadtest.server_process import free_port
from tests.integration.server_process import running_server
from tests.reliability.common import SERVE

IDLE_S = 1.0
WAIT_S = 20.0  # a bound for a failure to show; the close comes after IDLE_S
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, no flags, stream 0
GOAWAY = 7


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("grpc-idle") / "server.log"
    with running_server(log, command=SERVE, device="cpu", grpc_port=str(grpc_port), keepalive_timeout_s=str(IDLE_S)):
        yield f"127.0.0.1:{grpc_port}"


def frame_types(received: bytes) -> list[int]:
    """The HTTP/2 frame types in what the server sent (each frame: 3-byte length, type, flags, stream)."""
    types, at = [], 0
    while at + 9 <= len(received):
        length = int.from_bytes(received[at : at + 3], "big")
        types.append(received[at + 3])
        at += 9 + length
    return types


def test_an_idle_connection_is_closed_after_the_idle_limit(server: str) -> None:
    host, port = server.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(PREFACE + EMPTY_SETTINGS)  # then nothing: no call, ever
        opened = time.monotonic()
        sock.settimeout(WAIT_S)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pytest.fail(f"the idle connection was still open after {WAIT_S} s (frames {frame_types(received)})")
        held_s = time.monotonic() - opened
    assert GOAWAY in frame_types(received), frame_types(received)
    assert held_s >= IDLE_S * 0.5, held_s  # closed for being idle, not refused at once
