"""TLS on both ports (CGSERVE_TLS_*), against real servers and a throwaway CA made with `openssl`:
https and a secure gRPC port that clients verify against the CA; plain HTTP and plain gRPC to them
fail; with a client CA (mutual TLS, and N workers) a client without a certificate is refused on
both ports and one with a certificate is served; the inline path answers over TLS; a key without
its certificate, or a file that cannot be read, stops the start-up with a line naming the setting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from loadtest.server_process import HOST, POLL_S, ServerProcess, free_port, free_ports
from tests.integration.server_process import ROOT, START_TIMEOUT_S
from tests.reliability.common import SERVE

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command line")

IMAGE = (np.arange(784) % 256).astype(np.uint8)  # one 28×28 image
RAW = IMAGE.tobytes()
OCTETS = {"content-type": "application/octet-stream"}
V2_BODY = orjson.dumps(
    {"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": IMAGE.tolist()}]}
)


# --- a throwaway PKI ---------------------------------------------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def signed(folder: Path, name: str, extensions: str) -> None:
    """`name`.key and `name`.crt, signed by the CA in `folder`, with these X.509v3 extensions."""
    (folder / f"{name}.ext").write_text(extensions)
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)  # fmt: skip
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=folder)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt; server.crt/.key for 127.0.0.1; client.crt/.key; all in one folder."""
    folder = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test CA", cwd=folder)  # fmt: skip
    signed(folder, "server", f"subjectAltName=IP:{HOST}\nextendedKeyUsage=serverAuth\n")
    signed(folder, "client", "extendedKeyUsage=clientAuth\n")
    return folder


def client_context(pki: Path, *, certificate: bool = False, maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """Verifies the server against the test CA; presents the client certificate if asked."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if certificate:
        context.load_cert_chain(pki / "client.crt", pki / "client.key")
    if maximum is not None:
        context.maximum_version = maximum
    return context


# --- servers -------------------------------------------------------------------------------------


@contextmanager
def tls_server(log_path: Path, pki: Path, **settings: str) -> Iterator[tuple[str, str, ServerProcess]]:
    """The service with TLS on both ports: (https URL, gRPC address, its process) once /readyz answers 200
    over https (presenting the client certificate: it works with a client CA and without)."""
    port, grpc_port = free_ports(2)
    env = {"CGSERVE_HOST": HOST, "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": str(grpc_port)}
    env |= {"CGSERVE_DEVICE": "cpu", "CGSERVE_BUCKETS": "1,2,4", "CGSERVE_DRAIN_SECONDS": "0.1"}  # a quick stop
    env |= {"CGSERVE_TLS_CERT_FILE": str(pki / "server.crt"), "CGSERVE_TLS_KEY_FILE": str(pki / "server.key")}
    env |= {f"CGSERVE_{name.upper()}": value for name, value in settings.items()}
    server = ServerProcess(SERVE, log_path, port=port, env=env, cwd=ROOT)
    url = f"https://{HOST}:{port}"
    try:
        with httpx.Client(verify=client_context(pki, certificate=True), timeout=2.0, trust_env=False) as client:
            started = time.monotonic()
            while not ready(client, url):
                if server.proc.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
                    raise RuntimeError(f"the TLS server did not become ready:\n{server.log_tail()}")
                time.sleep(POLL_S)  # a process offers nothing to await: poll
        yield url, f"{HOST}:{grpc_port}", server
    finally:
        server.stop()


def ready(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/readyz").status_code == 200
    except httpx.TransportError:
        return False  # not listening yet


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[tuple[str, str, ServerProcess]]:
    """TLS, no client CA, one process."""
    with tls_server(tmp_path_factory.mktemp("tls") / "server.log", pki) as running:
        yield running


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[tuple[str, str, ServerProcess]]:
    """Mutual TLS, with two workers (uvicorn's manager passes the ssl options to each)."""
    log = tmp_path_factory.mktemp("mtls") / "server.log"
    with tls_server(log, pki, tls_client_ca_file=str(pki / "ca.crt"), workers="2") as running:
        yield running


# --- HTTP ------------------------------------------------------------------------------------------


def test_https_predict_and_v2_infer_verify_against_the_ca(server: tuple[str, str, ServerProcess], pki: Path) -> None:
    url, _, process = server
    with httpx.Client(base_url=url, verify=client_context(pki), trust_env=False) as client:
        predicted = client.post("/predict", content=RAW, headers=OCTETS)
        inferred = client.post("/v2/models/fashion-cnn/infer", content=V2_BODY)
    assert predicted.status_code == 200 and len(predicted.json()["predictions"]) == 1, predicted.text
    assert inferred.status_code == 200 and inferred.json()["outputs"][0]["shape"] == [1, 10], inferred.text
    log = process.log_tail(100_000)
    assert f"HTTP on {url} (" in log and " with TLS" in log, log


def test_a_client_that_does_not_trust_the_ca_is_refused_by_its_own_check(
    server: tuple[str, str, ServerProcess],
) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{server[0]}/healthz", trust_env=False)  # the system's CAs: not ours


def test_plain_http_to_the_tls_port_gets_no_answer(server: tuple[str, str, ServerProcess]) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.post(server[0].replace("https://", "http://") + "/predict", content=RAW, headers=OCTETS, trust_env=False)


def tls12_answer(url: str, pki: Path, request: bytes) -> tuple[bytes, int]:
    """One request over TLS 1.2 on a raw socket: (the HTTP answer, how many TLS application-data records
    carried it). TLS 1.2, because 1.3 sends session tickets in such records too after the handshake."""
    host, port = url.removeprefix("https://").split(":")
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(pki, maximum=ssl.TLSVersion.TLSv1_2).wrap_bio(incoming, outgoing, server_hostname=host)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(sock.recv(65536))
        sock.sendall(outgoing.read())
        tls.write(request)
        sock.sendall(outgoing.read())
        wire, answer = b"", b""
        while not complete(answer):
            data = sock.recv(65536)
            assert data, f"closed after {answer!r}"
            wire += data
            incoming.write(data)
            try:
                while True:
                    answer += tls.read(65536)
            except ssl.SSLWantReadError:
                pass
    records = 0
    while wire:  # each record: type (1 byte), version (2), length (2), payload
        records += wire[0] == 23  # application data
        wire = wire[5 + int.from_bytes(wire[3:5], "big") :]
    return answer, records


def complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return len(body) >= length


def test_the_inline_path_answers_over_tls(server: tuple[str, str, ServerProcess], pki: Path) -> None:
    """The inline path writes its whole answer at once (app/http/protocol.py write_answer): one TLS
    record; uvicorn's ASGI send() writes the head and the body apart: two. A chunked body never goes
    inline (app/http/inline.py), so the same request chunked shows the other path on the same server."""
    head = f"POST /predict HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/octet-stream\r\n"
    inline = (head + f"content-length: {len(RAW)}\r\n\r\n").encode() + RAW
    chunked = (head + f"transfer-encoding: chunked\r\n\r\n{len(RAW):x}\r\n").encode() + RAW + b"\r\n0\r\n\r\n"
    (inline_answer, inline_records), (asgi_answer, asgi_records) = (
        tls12_answer(server[0], pki, request) for request in (inline, chunked)
    )
    assert inline_answer.startswith(b"HTTP/1.1 200 ") and asgi_answer.startswith(b"HTTP/1.1 200 "), inline_answer
    assert (inline_records, asgi_records) == (1, 2)
    bodies = [orjson.loads(answer.partition(b"\r\n\r\n")[2]) for answer in (inline_answer, asgi_answer)]
    assert bodies[0] == bodies[1]  # the same answer both ways


# --- gRPC ------------------------------------------------------------------------------------------


def triton_infer(address: str, pki: Path, *, certificate: bool) -> np.ndarray:
    client = triton_grpc.InferenceServerClient(
        address,
        ssl=True,
        root_certificates=str(pki / "ca.crt"),
        private_key=str(pki / "client.key") if certificate else None,
        certificate_chain=str(pki / "client.crt") if certificate else None,
    )
    try:
        tensor = triton_grpc.InferInput("input", [1, 1, 28, 28], "UINT8")
        tensor.set_data_from_numpy(IMAGE.reshape(1, 1, 28, 28))
        result = client.infer("fashion-cnn", [tensor], client_timeout=20)
        scores = result.as_numpy("probabilities")
        assert scores is not None
        return scores
    finally:
        client.close()


def test_grpc_over_tls_verifies_against_the_ca(server: tuple[str, str, ServerProcess], pki: Path) -> None:
    _, address, process = server
    scores = triton_infer(address, pki, certificate=False)
    assert scores.shape == (1, 10) and abs(float(scores.sum()) - 1.0) < 1e-4
    assert f"gRPC (Open Inference Protocol) on {address} with TLS" in process.log_tail(100_000)


def test_plain_grpc_to_the_tls_port_fails(server: tuple[str, str, ServerProcess]) -> None:
    with grpc.insecure_channel(server[1]) as channel, pytest.raises(grpc.FutureTimeoutError):
        grpc.channel_ready_future(channel).result(timeout=3)


# --- mutual TLS, two workers -----------------------------------------------------------------------


def test_mutual_tls_serves_a_client_with_a_certificate_on_both_ports(
    mutual: tuple[str, str, ServerProcess], pki: Path
) -> None:
    url, address, process = mutual
    with httpx.Client(base_url=url, verify=client_context(pki, certificate=True), trust_env=False) as client:
        answers = [client.post("/predict", content=RAW, headers=OCTETS) for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert triton_infer(address, pki, certificate=True).shape == (1, 10)
    log = process.log_tail(100_000)
    assert f"HTTP on {url} (" in log and "clients must present a certificate" in log, log
    assert f"on {address} with mutual TLS" in log, log


def test_mutual_tls_refuses_a_client_without_a_certificate_on_both_ports(
    mutual: tuple[str, str, ServerProcess], pki: Path
) -> None:
    with pytest.raises(httpx.TransportError):  # the server's alert: at the handshake (1.2) or the first read (1.3)
        httpx.post(f"{mutual[0]}/predict", content=RAW, headers=OCTETS, verify=client_context(pki), trust_env=False)
    with pytest.raises(InferenceServerException, match=r"UNAVAILABLE|handshake|certificate"):
        triton_infer(mutual[1], pki, certificate=False)


# --- start-up errors -------------------------------------------------------------------------------


def start_up_error(pki: Path, **settings: str) -> tuple[int, str]:
    """The exit status and stderr of a server that must not start."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CGSERVE_")}
    env |= {"CGSERVE_HOST": HOST, "CGSERVE_PORT": str(free_port()), "CGSERVE_GRPC_PORT": "0", "CGSERVE_DEVICE": "cpu"}
    env |= {f"CGSERVE_{name.upper()}": value for name, value in settings.items()}
    done = subprocess.run(SERVE, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


def test_a_key_without_its_certificate_is_a_start_up_error_naming_both(pki: Path) -> None:
    code, stderr = start_up_error(pki, tls_key_file=str(pki / "server.key"))
    assert code != 0
    assert "CGSERVE_TLS_CERT_FILE and CGSERVE_TLS_KEY_FILE together" in stderr and "tls_cert_file is not" in stderr


def test_a_missing_certificate_file_is_a_start_up_error_naming_setting_and_path(pki: Path) -> None:
    missing = pki / "nowhere.crt"
    code, stderr = start_up_error(pki, tls_cert_file=str(missing), tls_key_file=str(pki / "server.key"))
    assert code != 0
    assert f"CGSERVE_TLS_CERT_FILE / --tls-cert-file: Value error, cannot read {missing}" in stderr, stderr


def test_a_key_that_is_not_the_certificates_is_a_start_up_error(pki: Path) -> None:
    code, stderr = start_up_error(pki, tls_cert_file=str(pki / "server.crt"), tls_key_file=str(pki / "client.key"))
    assert code != 0 and "are not a PEM certificate and its unencrypted private key" in stderr, stderr


def test_a_tls_close_notify_after_a_request_logs_no_warning(server: tuple[str, str, ServerProcess], pki: Path) -> None:
    """A client's close_notify after its request: asyncio's TLS transport closes whatever eof_received says,
    and logged "returning true from eof_received() has no effect when using ssl" for each such connection
    (a client could write the log full). The plain-TCP half-close (tests/integration/test_http_framing.py)
    keeps the connection for its answers; TLS cannot."""
    head = f"POST /predict HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/octet-stream\r\n"
    request = (head + f"content-length: {len(RAW)}\r\n\r\n").encode() + RAW
    host, port = server[0].removeprefix("https://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            tls = client_context(pki, certificate=True).wrap_socket(raw, server_hostname=host)
            tls.sendall(request)
            with contextlib.suppress(OSError):  # ssl.SSLError among them: the server may close first
                tls.unwrap()  # close_notify, then the server's
    time.sleep(0.5)  # the server's log line, where there is one, follows the close
    log = server[2].log_path.read_text(errors="replace")
    assert "eof_received" not in log, server[2].log_tail()
