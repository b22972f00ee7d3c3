"""The LitServe reference server: the eager model's labels through LitServe's batching, bodies
decoded by app.codecs.bodies, bad bodies refused with the decoder's message. A real process: LitServe
runs its HTTP server and its inference worker as processes of their own."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.payloads import build_payloads
from loadtest.server_process import HOST, free_port, running

pytest.importorskip("litserve", reason="the LitServe comparison needs .venv/bin/pip install -e '.[compare]'")
pytestmark = pytest.mark.integration


def test_litserve_answers_the_eager_labels_and_refuses_bad_bodies(tmp_path: Path) -> None:
    raw = build_payloads("raw", images_per_request=3, limit=60)
    json_form = build_payloads("json", images_per_request=2, limit=60)
    port = free_port()
    argv = [sys.executable, "-m", "loadtest.servers.litserve_server", "--host", HOST, "--port", str(port)]
    argv += ["--device", "cpu", "--max-batch-size", "8", "--batch-timeout-ms", "5"]
    with (
        running(argv, tmp_path / "litserve.log", port=port, ready_timeout_s=120) as server,
        httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client,
    ):
        answers = [
            client.post("/predict", content=body, headers={"content-type": payloads.content_type})
            for payloads in (raw, json_form)
            for body in payloads.bodies[:4]
        ]
        short = client.post("/predict", content=b"\x00" * 100, headers={"content-type": "application/octet-stream"})
        text = client.post("/predict", content=b"hello", headers={"content-type": "text/plain"})
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    labels = [tuple(p["label"] for p in a.json()["predictions"]) for a in answers]
    assert labels == [*raw.expected[:4], *json_form.expected[:4]]  # each request gets its own rows back
    first = answers[0].json()
    assert first["model"] == "fashion-cnn" and first["engine"] == "litserve-eager-cpu-fp32"
    assert np.allclose([sum(p["scores"]) for p in first["predictions"]], 1.0, atol=1e-5)
    # LitServe wraps an HTTPException's detail: {"detail": <the service's error body>}.
    assert short.status_code == 422 and "not a multiple of one" in short.json()["detail"]["error"]["message"]
    assert text.status_code == 415 and "text/plain" in text.json()["detail"]["error"]["message"]
