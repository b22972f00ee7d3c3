"""The load generator end to end against real server processes: short, bounded runs whose
records must hold every figure and show every answer correct (0 errors)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.server_process import free_port, free_ports, running, service_env
from tests.integration.server_process import running_server
from tests.reliability.common import SERVE

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 120  # the generator bounds itself; this only catches a hang


def loadtest(*args: str, out: Path) -> dict[str, Any]:
    """Run `python -m loadtest ARGS --out OUT --quiet` and return the record it wrote."""
    argv = [sys.executable, "-m", "loadtest", *args, "--out", str(out), "--quiet"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{argv}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return json.loads(out.read_text())


def assert_all_correct(record: dict[str, Any]) -> None:
    counts = record["counts"]
    assert counts["measured"] > 0
    assert record["errors"] == {} and record["warmup_errors"] == {}, record["error_examples"]
    assert counts["ok"] == counts["measured"] and counts["errors"] == 0
    assert record["throughput_rps"] > 0
    lat = record["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"] <= lat["max"]


def test_open_loop_json(server_url: str, tmp_path: Path) -> None:
    record = loadtest(
        "--url", server_url, "--rate", "50", "--duration", "3", "--warmup", "0.5", "--form", "json",
        out=tmp_path / "json.json",
    )  # fmt: skip
    assert_all_correct(record)
    assert record["schema"] == "cgserve-loadtest/1"
    assert record["mode"] == "open" and record["arrivals"] == "poisson"
    assert record["target_rate_rps"] == 50 and record["duration_s"] == 3 and record["warmup_s"] == 0.5
    assert record["latency_from"] == "scheduled send time"
    assert record["labels_checked"] is True and record["payloads"]["images_used"] > 900
    assert record["server"]["engine"] == "eager"
    assert record["command"].startswith("python -m loadtest --url") and "--rate 50" in record["command"]
    assert record["client"] == "lean"  # the default driver
    assert 20 < record["offered_rate_rps"] < 90  # Poisson(150) over 3 s
    assert record["summary"] and {"p50", "p90", "p99", "p99_9", "max"} <= set(record["latency_ms"])


@pytest.mark.parametrize("form", ["png", "raw"])
def test_open_loop_png_and_raw(server_url: str, tmp_path: Path, form: str) -> None:
    record = loadtest(
        "--url", server_url, "--rate", "30", "--duration", "1.5", "--warmup", "0.3", "--form", form,
        out=tmp_path / f"{form}.json",
    )  # fmt: skip
    assert_all_correct(record)
    assert record["form"] == form


def test_closed_loop_two_processes_batched_raw(server_url: str, tmp_path: Path) -> None:
    record = loadtest(
        "--url", server_url, "--concurrency", "4", "--processes", "2", "--duration", "1.5", "--warmup", "0.3",
        "--form", "raw", "--raw-dtype", "float32", "--batch", "4",
        out=tmp_path / "closed.json",
    )  # fmt: skip
    assert_all_correct(record)
    assert record["mode"] == "closed" and record["processes"] == 2 and record["concurrency"] == 4
    assert record["images_per_s"] == pytest.approx(4 * record["throughput_rps"], abs=0.1)
    assert record["path"] == "/predict?dtype=float32"


def test_sweep_reports_capacity_and_draws_the_curve(server_url: str, tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "loadtest", "sweep", "--url", server_url, "--rates", "10,20",
        "--slo-p99-ms", "5000", "--duration", "1", "--warmup", "0.3", "--out", str(tmp_path / "sweep.json"), "--quiet",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert sweep["schema"] == "cgserve-loadtest-sweep/1"
    assert [s["target_rate_rps"] for s in sweep["steps"]] == [10, 20]
    assert all(s["passed"] for s in sweep["steps"]) and sweep["capacity_rps"] == 20
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "capacity: 20 req/s" in done.stdout


def test_noop_server_answers_same_shape(noop_url: str, tmp_path: Path) -> None:
    for form in ("json", "png", "raw"):
        record = loadtest(
            "--url", noop_url, "--concurrency", "2", "--duration", "1", "--warmup", "0.2", "--form", form,
            "--no-check-labels", out=tmp_path / f"noop-{form}.json",
        )  # fmt: skip
        assert_all_correct(record)
        assert record["server"] == {"model": "noop", "engine": "noop"} and record["labels_checked"] is False


def test_both_clients_count_the_same_closed_loop_alike(server_url: str, tmp_path: Path) -> None:
    """The lean driver and httpx, same labelled load: every answer checked by each, the same
    bookkeeping (closed loop: every measured request was sent in the window), CPU per request."""
    records = {}
    for client in ("lean", "httpx"):
        records[client] = loadtest(
            "--url", server_url, "--concurrency", "2", "--duration", "1.5", "--warmup", "0.3", "--form", "json",
            "--client", client, out=tmp_path / f"{client}.json",
        )  # fmt: skip
    for client, record in records.items():
        assert_all_correct(record)
        assert record["client"] == client and f"--client {client}" in record["command"]
        assert record["server"]["engine"] == "eager" and record["loadgen_cpu_us_per_request"] > 0
        assert record["counts"]["waited_for_connection"] == 0  # one connection per client in flight


@pytest.fixture(scope="module")
def v2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The real service on the CPU with gRPC on a free port: its HTTP and gRPC base URLs."""
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("v2") / "server.log"
    with running_server(log, command=SERVE, device="cpu", grpc_port=str(grpc_port)) as url:
        yield {"http": url, "grpc": f"grpc://127.0.0.1:{grpc_port}"}


@pytest.mark.parametrize("client", ["lean", "httpx", "grpc", "grpc-stream"])
def test_the_v2_form_over_http_and_grpc_is_answered_right(
    v2_server: dict[str, str], tmp_path: Path, client: str
) -> None:
    """The Open Inference Protocol as our generator sends it (issue 26.1): binary UINT8 over HTTP, ModelInfer
    calls and ModelStreamInfer streams over gRPC, three images a request, every label checked."""
    url = v2_server["grpc" if client.startswith("grpc") else "http"]
    record = loadtest(
        "--url", url, "--client", client, "--form", "v2", "--batch", "3", "--concurrency", "4", "--processes", "2",
        "--duration", "1.5", "--warmup", "0.3", out=tmp_path / f"{client}.json",
    )  # fmt: skip
    assert_all_correct(record)
    assert record["labels_checked"] is True and record["client"] == client
    assert record["server"]["model"] == "fashion-cnn" and record["images_per_request"] == 3


@pytest.mark.parametrize(("client", "kind"), [("lean", "http_404"), ("grpc", "grpc_NOT_FOUND"),
                                              ("grpc-stream", "grpc_stream_error")])  # fmt: skip
def test_v2_requests_the_server_refuses_are_counted_as_errors(
    v2_server: dict[str, str], tmp_path: Path, client: str, kind: str
) -> None:
    url = v2_server["grpc" if client.startswith("grpc") else "http"]
    record = loadtest(
        "--url", url, "--client", client, "--form", "v2", "--concurrency", "2", "--duration", "0.5", "--warmup", "0",
        "--path", "/v2/models/nope/infer", "--no-check-labels", out=tmp_path / "refused.json",
    )  # fmt: skip
    assert record["counts"]["ok"] == 0 and set(record["errors"]) == {kind}, record["errors"]
    assert "nope" in record["error_examples"][kind]


def test_a_grpc_stream_run_ends_with_its_record_when_the_server_goes_away(tmp_path: Path) -> None:
    """Streams the server ended while they waited for their next request are opened again (or counted), and
    the run ends by itself with its record: not a crash of the generator. The server is killed once it has
    answered over gRPC; the run's 8 s leave a slow machine room to start the generator first."""
    port, grpc_port = free_ports(2)
    env = service_env(port, device="cpu", grpc_port=grpc_port)
    out = tmp_path / "gone.json"
    argv = [sys.executable, "-m", "loadtest", "--url", f"grpc://127.0.0.1:{grpc_port}", "--client", "grpc-stream",
            "--form", "v2", "--rate", "100", "--duration", "8", "--warmup", "0", "--timeout", "1",
            "--no-check-labels", "--out", str(out), "--quiet"]  # fmt: skip
    with running(SERVE, tmp_path / "server.log", port=port, env=env, ready_timeout_s=90) as server:
        generator = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        give_up = time.monotonic() + 60
        while 'protocol="grpc"' not in httpx.get(f"{server.url}/metrics").text and time.monotonic() < give_up:
            time.sleep(0.1)  # until the streams have answered (a figure to poll, not to await)
        server.proc.kill()
        _, stderr = generator.communicate(timeout=RUN_TIMEOUT_S)
    assert generator.returncode == 0, stderr
    record = json.loads(out.read_text())
    assert record["counts"]["ok"] > 0 and record["errors"], record["counts"]
