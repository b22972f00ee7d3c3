"""The load generator's pure parts, without a server: schedule, percentiles, windows, merging,
answer checking, payload encoding (against app.codecs), CLI round trips, sweep and bench reports."""

from __future__ import annotations

import io
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from app.codecs import decode_image, decode_json, decode_raw
from loadtest.__main__ import _options, _spec, build_parser
from loadtest.bench_report import markdown, ratios
from loadtest.bench_server import parse_hey
from loadtest.payloads import (
    MULTIPART_BOUNDARY,
    PayloadOptions,
    build_payloads,
    encode_json,
    encode_png,
    encode_raw,
    load_images,
    to_unit_float,
    top2_margin,
)
from loadtest.pinning import core_list, parse_cores, plan_pinning
from loadtest.runner import LoadSpec, validate_url, worker_specs
from loadtest.stats import (
    WorkerResult,
    latency_summary_ms,
    merge_results,
    percentile,
    poisson_schedule,
    split_evenly,
    window_result,
)
from loadtest.sweep import plot_sweep, step_verdict
from loadtest.worker import check_answer

# --- percentiles -----------------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    values = np.arange(1, 101, dtype=float)  # 1..100
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(values)
    assert percentile(shuffled, 50) == 50
    assert percentile(shuffled, 90) == 90
    assert percentile(shuffled, 99) == 99
    assert percentile(shuffled, 99.9) == 100  # rank ceil(99.9) = 100: never below a real sample
    assert percentile(shuffled, 100) == 100
    assert percentile(shuffled, 0) == 1


def test_percentile_edge_cases() -> None:
    assert percentile(np.array([]), 99) is None
    assert percentile(np.array([7.0]), 50) == 7.0
    assert percentile(np.array([1.0, 1000.0]), 50) == 1.0
    assert percentile(np.array([1.0, 1000.0]), 51) == 1000.0
    with pytest.raises(ValueError, match="within"):
        percentile(np.array([1.0]), 101)


def test_latency_summary_in_ms() -> None:
    summary = latency_summary_ms(np.array([0.001, 0.002, 0.003, 0.010]))
    assert summary["p50"] == 2.0 and summary["max"] == 10.0 and summary["min"] == 1.0
    assert set(summary) == {"p50", "p90", "p99", "p99_9", "max", "mean", "min"}
    assert all(v is None for v in latency_summary_ms(np.array([])).values())


# --- Poisson schedule -----------------------------------------------------------------------


def test_poisson_schedule_statistics() -> None:
    rate, horizon = 1000.0, 20.0
    times = poisson_schedule(rate, horizon, np.random.default_rng(1))
    n = len(times)
    assert abs(n - rate * horizon) < 5 * np.sqrt(rate * horizon)  # count ~ Poisson(20000)
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < horizon
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1
    # Counts in 1-second bins are Poisson: variance ≈ mean.
    counts = np.bincount(times.astype(int), minlength=int(horizon))
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.6)


def test_poisson_schedule_is_seeded_and_covers_short_horizons() -> None:
    a = poisson_schedule(50.0, 3.0, np.random.default_rng([0, 1]))
    b = poisson_schedule(50.0, 3.0, np.random.default_rng([0, 1]))
    c = poisson_schedule(50.0, 3.0, np.random.default_rng([0, 2]))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    tiny = poisson_schedule(0.5, 100.0, np.random.default_rng(3))  # few arrivals, long horizon
    assert tiny[-1] < 100.0 and len(tiny) > 20
    with pytest.raises(ValueError):
        poisson_schedule(0.0, 1.0, np.random.default_rng(0))


# --- windows and merging --------------------------------------------------------------------


def test_window_result_counts_by_schedule_send_and_completion() -> None:
    w0, w1 = 10.0, 20.0
    rows = [
        (5.0, 5.0, 5.1, None),  # warm-up, ok
        (9.0, 9.0, 9.5, "http_503:overloaded"),  # warm-up error: kept apart
        (9.9, 9.9, 10.5, None),  # warm-up, but its answer lands in the window: throughput
        (11.0, 11.0, 11.004, None),  # plain
        (12.0, 12.5, 12.6, None),  # sent 0.5 s late: latency from the schedule, 0.6 s
        (13.0, 12.9995, 13.002, None),  # timer fired early: latency from the real send
        (14.0, 14.0, 14.1, "wrong_label"),
        (19.9, 19.9, 20.3, None),  # answered after the window: measured, not throughput
    ]
    res = window_result(rows, w0, w1)
    assert res.measured == 5 and res.ok == 4
    assert res.errors == Counter({"wrong_label": 1})
    assert res.warmup_errors == Counter({"http_503:overloaded": 1}) and res.warmup_requests == 3
    assert res.sent_in_window == 5
    assert res.ok_in_window == 4  # 10.5, 11.004, 12.6, 13.002
    assert res.latencies_s.tolist() == pytest.approx([0.004, 0.6, 0.0025, 0.1, 0.4])
    assert res.lags_s.tolist() == pytest.approx([0.0, 0.5, -0.0005, 0.0, 0.0])


def test_merge_results_concatenates_raw_samples() -> None:
    a = WorkerResult(
        latencies_s=np.array([0.001, 0.002]),
        lags_s=np.array([0.0, 0.0]),
        ok=2,
        sent_in_window=2,
        ok_in_window=2,
        errors=Counter(),
        error_examples={},
        server={"model": "m", "engine": "cuda-graph"},
        cpu_s=1.0,
        wall_s=2.0,
    )
    b = WorkerResult(
        latencies_s=np.array([0.100]),
        lags_s=np.array([0.001]),
        ok=0,
        sent_in_window=1,
        ok_in_window=0,
        warmup_requests=3,
        errors=Counter({"timeout": 1}),
        error_examples={"timeout": "ReadTimeout"},
        connection_waits=4,
        cpu_s=0.5,
        wall_s=2.0,
    )
    merged = merge_results([a, b])
    assert sorted(merged.latencies_s.tolist()) == [0.001, 0.002, 0.100]
    assert merged.measured == 3 and merged.ok == 2 and merged.sent_in_window == 3
    assert merged.errors == Counter({"timeout": 1}) and merged.error_examples == {"timeout": "ReadTimeout"}
    assert merged.warmup_requests == 3 and merged.connection_waits == 4
    assert merged.server == {"model": "m", "engine": "cuda-graph"}
    assert merged.cpu_s == 1.5 and merged.wall_s == 4.0
    # A percentile of the merge is not an average of the processes' percentiles.
    assert percentile(merged.latencies_s, 50) == 0.002
    assert merge_results([]).measured == 0


def test_split_evenly() -> None:
    assert split_evenly(10, 3) == [4, 3, 3]
    assert split_evenly(2, 4) == [1, 1, 0, 0]
    assert sum(split_evenly(64, 7)) == 64


def test_worker_specs_share_the_load() -> None:
    payloads = build_payloads("raw", check_labels=False, limit=8)
    open_specs = worker_specs(LoadSpec(url="http://127.0.0.1:1", rate=900.0, processes=3), payloads)
    assert [s.rate for s in open_specs] == [300.0] * 3 and all(s.connections == 64 for s in open_specs)
    closed = worker_specs(LoadSpec(url="http://localhost:1", concurrency=5, processes=8), payloads)
    assert [s.concurrency for s in closed] == [1] * 5  # never more processes than clients
    assert [s.connections for s in closed] == [1] * 5
    assert [s.index for s in closed] == list(range(5))


def test_validate_url_accepts_only_this_machine() -> None:
    assert validate_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert validate_url("http://localhost:8000/") == "http://localhost:8000"
    assert validate_url("http://[::1]:8000") == "http://[::1]:8000"
    for bad in ("http://10.0.0.1:8000", "https://127.0.0.1:8000", "http://example.com", "http://127.0.0.1/predict"):
        with pytest.raises(ValueError):
            validate_url(bad)


# --- answers --------------------------------------------------------------------------------


def _answer(labels: list[int]) -> bytes:
    preds = [{"label": label, "class_name": "x", "scores": [0.1] * 10} for label in labels]
    return orjson.dumps({"model": "fashion-cnn", "engine": "eager", "predictions": preds})


def test_check_answer_kinds() -> None:
    assert check_answer(200, _answer([3, 1]), (3, 1), 2)[0] is None
    assert check_answer(200, _answer([3, 1]), None, 2)[0] is None
    assert check_answer(200, _answer([3, 2]), (3, 1), 2)[0] == "wrong_label"
    assert check_answer(200, _answer([3]), (3, 1), 2)[0] == "bad_response"
    assert check_answer(200, b"not json", (3,), 1)[0] == "bad_response"
    error = orjson.dumps({"error": {"code": "overloaded", "message": "queue full", "expected": "retry"}})
    assert check_answer(503, error, (3,), 1)[:2] == ("http_503:overloaded", "queue full")
    assert check_answer(502, b"<html>bad gateway</html>", (3,), 1)[0] == "http_502"


# --- payloads: what we send is what the service decodes --------------------------------------


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_images(16)  # uint8 (16, 28, 28)


def test_json_body_decodes_to_the_reference_pixels(images: np.ndarray) -> None:
    decoded = decode_json(encode_json(images[:4]), max_instances=64)  # (4, 1, 28, 28)
    assert np.array_equal(decoded[:, 0], to_unit_float(images[:4]))  # bit for bit


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_raw_body_decodes_to_the_reference_pixels(images: np.ndarray, dtype: str) -> None:
    decoded = decode_raw(encode_raw(images[:3], dtype), dtype=dtype, max_instances=64)
    assert np.array_equal(decoded[:, 0], to_unit_float(images[:3]))


def test_png_body_decodes_to_the_reference_pixels(images: np.ndarray) -> None:
    decoded = decode_image(encode_png(images[5]), max_pixels=4096 * 4096)
    assert np.array_equal(decoded[0, 0], to_unit_float(images[5:6])[0])


def test_multipart_body_is_well_formed(images: np.ndarray) -> None:
    from PIL import Image

    payloads = build_payloads("png", check_labels=False, limit=2)
    body = payloads.bodies[0]
    assert payloads.content_type == f"multipart/form-data; boundary={MULTIPART_BOUNDARY}"
    assert body.startswith(f"--{MULTIPART_BOUNDARY}\r\n".encode())
    assert body.endswith(f"\r\n--{MULTIPART_BOUNDARY}--\r\n".encode())
    png = body.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n--", 1)[0]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), images[0])


def test_payloads_carry_the_eager_labels_of_unambiguous_images() -> None:
    payloads = build_payloads("json", images_per_request=4, limit=200)
    assert payloads.expected is not None and len(payloads.expected) == len(payloads.bodies)
    assert all(len(e) == 4 for e in payloads.expected)
    info = payloads.info
    assert info["images_used"] + info["images_left_out_ambiguous"] >= 196
    # The labels are the model's, computed on exactly the decoded pixels of each body.
    from loadtest.payloads import reference_logits

    first = decode_json(payloads.bodies[0], max_instances=8)[:, 0]  # (4, 28, 28) float32
    logits = reference_logits(np.rint(first * 255).astype(np.uint8))
    assert tuple(logits.argmax(1).tolist()) == payloads.expected[0]
    assert (top2_margin(logits) >= info["min_margin_logits"]).all()


def test_payload_options_reject_bad_combinations() -> None:
    with pytest.raises(ValueError, match="one image"):
        build_payloads("png", images_per_request=2, check_labels=False, limit=4)
    with pytest.raises(ValueError, match="form"):
        build_payloads("xml", check_labels=False)
    raw = PayloadOptions(form="raw", raw_dtype="float32", check_labels=False, images=4).build()
    assert raw.path == "/predict?dtype=float32" and len(raw.bodies[0]) == 28 * 28 * 4


# --- CLI: the recorded commands reproduce the run --------------------------------------------


def test_recorded_command_parses_back_to_the_same_run() -> None:
    spec = LoadSpec(url="http://127.0.0.1:9", rate=250.0, processes=4, connections=128, warmup_s=1.5, seed=7)
    options = PayloadOptions(form="raw", batch=4, raw_dtype="float32", min_margin=1.0, images=100)
    args = build_parser().parse_args([*spec.to_args(), *options.to_args()])
    assert _spec(args, rate=args.rate, concurrency=args.concurrency) == spec
    assert _options(args) == options
    closed = LoadSpec(url="http://127.0.0.1:9", concurrency=16, processes=2)
    args = build_parser().parse_args([*closed.to_args(), *PayloadOptions(check_labels=False).to_args()])
    assert _spec(args, rate=args.rate, concurrency=args.concurrency) == closed
    assert _options(args) == PayloadOptions(check_labels=False)


def test_spec_validation_bounds_the_run() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        LoadSpec(url="http://127.0.0.1:9").validate()
    with pytest.raises(ValueError, match="duration"):
        LoadSpec(url="http://127.0.0.1:9", rate=10, duration_s=1e6).validate()
    with pytest.raises(ValueError, match="url"):
        LoadSpec(url="http://8.8.8.8:80", rate=10).validate()


# --- sweep ----------------------------------------------------------------------------------


def _step(rate: float, p50: float, p99: float, errors: int = 0) -> dict:
    return {
        "target_rate_rps": rate,
        "throughput_rps": rate * 0.99,
        "latency_ms": {"p50": p50, "p99": p99},
        "counts": {"errors": errors},
    }


def test_step_verdict() -> None:
    assert step_verdict(_step(100, 1, 4.9), 5)[0]
    assert not step_verdict(_step(100, 1, 5.1), 5)[0]
    assert not step_verdict(_step(100, 1, 1.0, errors=1), 5)[0]
    assert not step_verdict({"latency_ms": {"p99": None}, "counts": {"errors": 0}}, 5)[0]


def test_plot_sweep_writes_a_png(tmp_path: Path) -> None:
    steps = [_step(100, 1, 2), _step(200, 1.5, 4), _step(400, 9, 80)]
    for s in steps:
        s["passed"], s["verdict"] = step_verdict(s, 5)
    sweep = {
        "steps": steps,
        "slo_p99_ms": 5.0,
        "capacity_rps": 200.0,
        "capacity_throughput_rps": 198.0,
        "form": "json",
        "url": "http://127.0.0.1:8000",
    }
    path = tmp_path / "sweep.png"
    plot_sweep(sweep, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- bench driver ---------------------------------------------------------------------------


def test_core_lists_round_trip() -> None:
    assert parse_cores("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert core_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert core_list(parse_cores("5")) == "5"


def test_plan_pinning_refuses_missing_cores() -> None:
    assert plan_pinning("auto", "auto", no_pin=True)["server_cores"] is None
    plan = plan_pinning("0", "100000", no_pin=False)
    assert plan["loadgen_cores"] is None and any("not available" in n for n in plan["notes"])


HEY_OUTPUT = """
Summary:
  Total:        10.0012 secs
  Slowest:      0.0311 secs
  Requests/sec: 6123.4567

Latency distribution:
  10% in 0.0011 secs
  50% in 0.0024 secs
  90% in 0.0040 secs
  99% in 0.0080 secs

Status code distribution:
  [200] 61234 responses
  [503] 2 responses
"""


def test_parse_hey() -> None:
    hey = parse_hey(HEY_OUTPUT)
    assert hey["requests_per_s"] == 6123.4567
    assert hey["latency_ms"] == {"p50": 2.4, "p90": 4.0, "p99": 8.0}
    assert hey["status_codes"] == {"200": 61234, "503": 2}
    assert parse_hey("garbage")["requests_per_s"] is None


def _closed(c: int, rps: float) -> dict:
    return {"concurrency": c, "throughput_rps": rps, "counts": {"errors": 0}, "command": "python -m loadtest"}


def _server(role: str, rps: float) -> dict:
    open_loop = [
        {
            "fraction_of_saturation": f,
            "target_rate_rps": f * rps,
            "latency_ms": {"p99": 1.0 + f},
            "counts": {"errors": 0},
        }
        for f in (0.5, 0.9)
    ]
    return {
        "role": role,
        "command": "x",
        "closed_loop": [_closed(16, rps), _closed(32, rps * 0.9)],
        "saturation": {"throughput_rps": rps, "concurrency": 16},
        "open_loop": open_loop,
    }


def test_ratios_and_markdown() -> None:
    servers = {
        "noop": _server("ceiling", 6300.0),
        "naive": _server("baseline", 1800.0),
        "eager": {"role": "ours", "error": "TimeoutError: not ready"},
        "cuda-graph": _server("ours", 5400.0),
    }
    rat = ratios(servers)
    assert rat == {"cuda-graph_over_naive": 3.0, "cuda-graph_over_ceiling": 0.86}
    report = {
        "started_at": "2026-11-30T00:00:00+00:00",
        "command": "python -m loadtest.bench_server --out-dir x",
        "machine": {"gpu": "NVIDIA H200", "cpu_model": "Xeon", "cpu_count": 16, "torch": "2.11"},
        "pinning": {"server_cores": [0, 1], "loadgen_cores": [2, 3]},
        "settings": {
            "concurrencies": [16, 32],
            "processes": 2,
            "form": "json",
            "body_bytes_mean": 5661.0,
            "duration_s": 8.0,
            "warmup_s": 2.0,
        },
        "servers": servers,
        "ratios": rat,
        "notes": ["hey cross-check skipped"],
    }
    md = markdown(report)
    assert "| cuda-graph (ours) | 5,400 | c16 | 3.00× | 0.86 |" in md
    assert "| eager | TimeoutError: not ready |" in md
    assert "hey cross-check skipped" in md


def test_encode_png_writes_8bit_grayscale() -> None:
    # Signature, IHDR for 28×28 8-bit grayscale, and its CRC.
    png = encode_png(np.zeros((28, 28), dtype=np.uint8))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height, png[24], png[25]) == (28, 28, 8, 0)
    assert int.from_bytes(png[29:33], "big") == zlib.crc32(png[12:29])
