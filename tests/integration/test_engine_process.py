"""CGSERVE_ENGINE_PROCESS: two HTTP workers feeding one engine process, as a real server.

Every answer is checked against the eager model (the load generator's label check, with several
images per request and both body forms), the workers' and the engine process's metrics merge in
/metrics, and the service fails fast when the engine process dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.engine_process import SEGMENTS_ENV
from app.runtime.workers import segment_root
from tests.integration.server_process import running_server, settled_metrics

pytestmark = pytest.mark.integration


def loadtest(url: str, out: Path, *args: str) -> dict:
    argv = [sys.executable, "-m", "loadtest", "--url", url, "--out", str(out), "--quiet", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def metric_sum(exposition: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def engine_process(port: str) -> tuple[int, dict[str, str]]:
    """The engine process, the spawned child whose environment names this server's port: its pid and environment."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"spawn_main" in cmdline and f"CGSERVE_PORT={port}".encode() in environ:
            pairs = (item.decode(errors="replace").partition("=") for item in environ if b"=" in item)
            return int(entry.name), {name: value for name, _, value in pairs}
    raise AssertionError(f"no engine process for port {port}")


def test_workers_feed_one_engine_process_every_answer_right(tmp_path: Path) -> None:
    shm = segment_root(fallback="")  # "" where /dev/shm is too small: the metrics folder, removed anyway
    with running_server(tmp_path / "server.log", workers="2", engine_process="true") as url:
        # This server's segments (not another's on the machine, nor one killed before it could clean up).
        segments = Path(engine_process(url.rsplit(":", 1)[1])[1][SEGMENTS_ENV])
        assert httpx.get(f"{url}/readyz").json()["status"] == "ready"
        for form in ("raw", "json"):
            record = loadtest(
                url, tmp_path / f"{form}.json", "--form", form, "--batch", "3", "--concurrency", "8",
                "--processes", "2", "--duration", "2", "--warmup", "0.5",
            )  # fmt: skip
            assert record["counts"]["ok"] == record["counts"]["measured"] > 0, record["error_examples"]
            assert record["labels_checked"] is True
        exposition = settled_metrics(url)  # several processes: each flushes its own
        assert segments.is_dir() and any(segments.iterdir()), "the workers' segments are not where the server said"
        assert segments.parent == Path(shm) or not shm, "the workers' shared-memory segments are not under /dev/shm"
    # The engine process launched the batches (the workers have no batcher); the workers counted requests.
    assert metric_sum(exposition, "cgserve_batch_rows_sum") >= metric_sum(exposition, "cgserve_requests_total")
    assert metric_sum(exposition, "cgserve_batches_total") > 0
    # Where a request's time went, a figure a batch and a frame: the batch's wall time, the link's two stages.
    # (At most, not equal: a process's last flush may come after the scrape on a slow machine.)
    batches = metric_sum(exposition, "cgserve_batches_total")
    assert 0 < metric_sum(exposition, "cgserve_batch_wall_seconds_count") <= batches
    frames_sent = metric_sum(exposition, "cgserve_engine_link_seconds_count", stage="outbox")
    assert 0 < frames_sent <= metric_sum(exposition, "cgserve_requests_total")
    assert 0 < metric_sum(exposition, "cgserve_engine_link_seconds_count", stage="round_trip") <= frames_sent
    # Both kinds of event loop are sampled, apart: the workers' and the engine process's.
    for process in ("worker", "engines"):
        assert metric_sum(exposition, "cgserve_event_loop_lag_seconds_count", process=process) > 0, process
    # The engine process's collections are a series of their own (two loads make young ones).
    assert metric_sum(exposition, "cgserve_gc_pause_seconds_count", process="engines") > 0
    assert not segments.exists(), "the segments outlived the server"
    # The harness stops the server with SIGTERM to its whole process group: the engine process
    # must outlive the workers' drain, not leave them to find it gone.
    assert "the engine process is gone" not in (tmp_path / "server.log").read_text()


def test_a_dead_engine_process_fails_the_service_fast(tmp_path: Path) -> None:
    with running_server(tmp_path / "server.log", workers="2", engine_process="true") as url:
        port = url.rsplit(":", 1)[1]
        assert httpx.post(f"{url}/predict", json={"instances": [[0.0] * 784]}).status_code == 200
        os.kill(engine_process(port)[0], signal.SIGKILL)
        deadline, answered = time.monotonic() + 20, []
        while time.monotonic() < deadline:  # 503 while the workers go down, then nothing listens
            try:
                answered.append(httpx.post(f"{url}/predict", json={"instances": [[0.0] * 784]}).status_code)
            except httpx.TransportError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the server still answers 20 s after its engine process died: {answered[-5:]}")
        assert set(answered) <= {503}, answered
        log = (tmp_path / "server.log").read_text()
        assert "the engine process is gone" in log


def http_workers(port: str) -> list[int]:
    """The HTTP workers of the server on `port`: spawned children with its port, not the engine process (whose
    process name is its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline, comm = (entry / "cmdline").read_bytes(), (entry / "comm").read_text().strip()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, NotADirectoryError):
            continue
        if b"spawn_main" in cmdline and f"CGSERVE_PORT={port}".encode() in environ and comm.startswith("python"):
            found.append(int(entry.name))
    return found


def test_a_restarted_worker_keeps_the_engine_process_default_model(tmp_path: Path) -> None:
    """POST /predict's model is decided once, by the engine process; a worker restarted after the default model
    was unloaded took its own from the table it first got (another model's: it answered 200 from it, its peer
    404; a second review's find)."""
    repository, source = tmp_path / "repository", Path(__file__).resolve().parents[2] / "models" / "repository"
    shutil.copytree(source / "fashion-cnn", repository / "fashion-cnn", ignore=shutil.ignore_patterns("*.json"))
    octets = {"content-type": "application/octet-stream"}
    settings = {"workers": "2", "engine_process": "true", "model_control": "explicit"}
    with running_server(tmp_path / "server.log", model_repository=str(repository), **settings) as url:
        shutil.copytree(repository / "fashion-cnn", repository / "shirts")
        assert httpx.post(f"{url}/v2/repository/models/shirts/load", timeout=60).status_code == 200
        assert httpx.post(f"{url}/v2/repository/models/fashion-cnn/unload", timeout=60).status_code == 200
        port = url.rsplit(":", 1)[1]
        workers = http_workers(port)
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not set(http_workers(port)) - set(workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # the new worker listening, its first table applied
        # A connection each, so that both workers answer some (the kernel spreads them over the two sockets).
        statuses = {httpx.post(f"{url}/predict", content=bytes(784), headers=octets).status_code for _ in range(24)}
        assert statuses == {404}, statuses  # from either worker: the default model is unloaded
