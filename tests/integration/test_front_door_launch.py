"""The door's launcher (app/front_door/launch.c) on a machine without a GPU: the answers it writes are orjson's
byte for byte; where CUDA's driver is not there it refuses to start, leaving POST /predict to the batcher; and,
driven through a stand-in for the driver (fake_cuda.c), each request gets its own row's answer from the slots,
its figures add up, a close answers what it took and hands the rest to the bulk, and a failed or hung batch
answers 503. Its GPU side (the engine's graphs launched from C, answers equal to the service's port's) is
tests/gpu/test_front_door_gpu.py's."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.integration.door_toolchain import door_toolchain
from tests.integration.fake_cuda import build_fake_cuda, stand_in_slots
from tests.integration.server_process import ROOT
from tests.integration.test_front_door import door_alone, taken_ids

pytestmark = pytest.mark.skipif(door_toolchain() is not None, reason="no C compiler or nghttp2 headers for the door")


@pytest.fixture(scope="module")
def library() -> ctypes.CDLL:
    from app.front_door.door import _load
    from app.front_door.library import door_library

    configured = os.environ.get("CGSERVE_FRONT_DOOR_LIBRARY")
    return _load(door_library(Path(configured) if configured else None))


def c_float(library: ctypes.CDLL, value: np.float32) -> bytes:
    out = ctypes.create_string_buffer(64)
    length = library.fmt_f32(out, ctypes.c_float(value))
    return out.raw[:length]


def test_scores_are_written_as_orjson_writes_them(library: ctypes.CDLL) -> None:
    """Every kind of float32: probabilities, whole numbers, each decimal exponent, subnormals, signed zeros, the
    limits, NaN and the infinities, and 200,000 random bit patterns."""
    rng = np.random.default_rng(0)
    chosen = [
        0.0,
        -0.0,
        1.0,
        0.5,
        0.1,
        1e-7,
        1.5e-7,
        1e-6,
        9.999999e-7,
        1e12,
        9.999999e12,
        1e13,
        16777216.0,
        3.4028235e38,
        1e-45,
        1.17549435e-38,
        float("nan"),
        float("inf"),
        -float("inf"),
        123.25,
        -0.0000035,
    ]
    decades = [m * 10.0**e for e in range(-45, 39) for m in (1.0, 1.5, 9.999999)]
    probabilities = rng.dirichlet(np.ones(10), 2000).ravel()
    # Each power of two and the floats either side: below one the floats are twice as close as above it, and the
    # correctly rounded digits need not read back where the next ones up do (2**-96: 1.2621775e-29).
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    beside = np.concatenate([powers, np.nextafter(powers, np.float32(0)), np.nextafter(powers, np.float32(np.inf))])
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore"):  # 9.999999e38 and up: infinity
        chosen_values = np.array(chosen + decades, np.float32)
    values = np.concatenate([chosen_values, beside, probabilities.astype(np.float32), bits])
    want = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    wrong = [(struct.pack("<f", v).hex(), c_float(library, v), w)
             for v, w in zip(values.tolist(), want, strict=True) if c_float(library, np.float32(v)) != w]  # fmt: skip
    assert not wrong[:10], f"{len(wrong)} of {len(values)} differ (bits, C, orjson): {wrong[:10]}"


def test_without_cuda_the_launcher_refuses_to_start() -> None:
    """No libcuda.so.1 here: open_launcher says so, and the door goes on serving through the feeder. In a process
    of its own: the other tests' stand-in for the driver, once loaded, is what dlopen finds."""
    if ctypes.util.find_library("cuda"):
        pytest.skip("CUDA's driver is installed here")
    done = subprocess.run([sys.executable, "-c", WITHOUT_CUDA], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "refused: the front door's launcher did not start: libcuda.so.1"


WITHOUT_CUDA = """
from app.engines.cuda import LauncherHandles
from tests.integration.test_front_door import door_alone
handles = LauncherHandles(stream=0, context=0, buckets=(1, 2), ins=[1] * 3, outs=[1] * 3, graphs=[1] * 6,
                          starts=[1] * 3, dones=[1] * 3, width=10)
with door_alone((1, 28, 28), threads=1, full_rows=2, max_connections=8) as (door, _):
    try:
        door.open_launcher(handles, b'{"x":', [b","] * 10, (b"503 Service Unavailable", b"", b"{}"), 1.0)
    except ValueError as error:
        print("refused:", str(error).split(":", 2)[0] + ":" + str(error).split(":", 2)[1])
    assert door.launcher_figures() is None and door.close_launcher(1.0)
"""


BUCKETS, WIDTH, SHAPE = (1, 4, 16), 10, (1, 28, 28)  # 16: every request of the 16 connections fits a slot
PREFIX, NAMES = b'{"model":"m","predictions":[{"label":', [b',"class_name":"c%d","scores":[' % j for j in range(WIDTH)]
FAILURE = (b"503 Service Unavailable", b"content-type: application/json\r\n", b'{"error":"dead"}')


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if ctypes.util.find_library("cuda"):
        pytest.skip("CUDA's driver is installed here: the stand-in would not be the one launch.c opens")
    return build_fake_cuda(tmp_path_factory.mktemp("fake-cuda"))


@pytest.fixture
def launched(fake_cuda: ctypes.CDLL) -> Iterator[tuple[Any, tuple[str, int], ctypes.CDLL]]:
    """A door with the launcher open on three stand-in slots: (the Door, its address, the stand-in driver)."""
    fake_cuda.fake_cuda_mode(0)
    slots = stand_in_slots(BUCKETS, SHAPE, WIDTH)
    with door_alone(SHAPE, threads=4, full_rows=16, max_connections=64) as (door, address):
        door.open_launcher(slots.handles, PREFIX, NAMES, FAILURE, 0.3)
        yield door, address, fake_cuda
        door.close_launcher(5.0)
        door.free_launcher()
        del slots  # kept alive until the launcher is closed


def post(address: tuple[str, int], images: list[np.ndarray]) -> list[tuple[int, bytes]]:
    """Each image POSTed to /predict on one keep-alive connection: (status, body) each."""
    answers = []
    with socket.create_connection(address, timeout=10) as connection:
        reader = connection.makefile("rb")
        for image in images:
            connection.sendall(b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
                               b"Content-Length: %d\r\n\r\n" % image.nbytes + image.tobytes())  # fmt: skip
            status, length = int(reader.readline().split()[1]), 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answers.append((status, reader.read(length)))
    return answers


def expected(image: np.ndarray) -> bytes:
    """The stand-in's answer to `image`, as answers.py would write it: scores 1 / (byte j + 3), in float32."""
    scores = np.float32(1) / (image.reshape(-1)[:WIDTH].astype(np.float32) + np.float32(3))
    label = int(scores.argmax())
    written = orjson.dumps(scores[None], option=orjson.OPT_SERIALIZE_NUMPY)[2:-2]
    return PREFIX + b"%d" % label + NAMES[label] + written + b"]}]}"


def test_each_request_gets_its_own_rows_answer_and_the_figures_add_up(launched: Any) -> None:
    door, address, fake = launched
    launches = fake.fake_cuda_launches()
    images = list(np.random.default_rng(3).integers(0, 256, (16 * 25, *SHAPE), dtype=np.uint8))
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, [address] * 16, [images[c::16] for c in range(16)]))
    for c, answered in enumerate(answers):
        assert answered == [(200, expected(image)) for image in images[c::16]]
    assert door.take() is None  # none went to the bulk: every row fitted a slot
    figures = door.launcher_figures()
    assert len(figures.latencies) == len(images) and (figures.latencies > 0).all()
    assert int(figures.rows.sum()) == len(images) and len(figures.rows) == fake.fake_cuda_launches() - launches
    smallest = [min(b for b in BUCKETS if b >= rows) for rows in figures.rows.tolist()]
    assert figures.buckets.tolist() == smallest
    assert np.allclose(figures.seconds, 0.05e-3)  # the stand-in's 0.05 ms a batch
    assert (figures.pending, figures.dead, figures.failed, figures.lost) == (0, None, 0, 0)
    assert door.counts()[0] == len(images)


def test_after_a_close_requests_go_to_the_bulk(launched: Any) -> None:
    door, address, _ = launched
    image = np.full(SHAPE, 7, np.uint8)
    assert post(address, [image]) == [(200, expected(image))]
    assert door.close_launcher(5.0)
    assert door.launcher_figures() is not None  # its last figures, until freed
    door.free_launcher()
    assert door.launcher_figures() is None
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, address, [image])
        ids = taken_ids(door, 1)
        door.answer(np.array(ids, np.uint64), [b"{}"], b"200 OK", [b"content-type: application/json\r\n"])
        assert waiting.result() == [(200, b"{}")]


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_a_failed_or_hung_batch_answers_503_and_stops_the_launcher(launched: Any, mode: str) -> None:
    door, address, fake = launched
    fake.fake_cuda_mode({"fail": 1, "hang": 2}[mode])
    image = np.zeros(SHAPE, np.uint8)
    assert post(address, [image]) == [(503, FAILURE[2])]
    figures = door.launcher_figures()
    assert figures.dead is not None and ("did not complete" in figures.dead) == (mode == "hang")
    assert figures.failed == 1 and len(figures.latencies) == 0
    fake.fake_cuda_mode(0)
    with ThreadPoolExecutor(1) as pool:  # a dead launcher takes no row: the next goes to the bulk
        waiting = pool.submit(post, address, [image])
        ids = taken_ids(door, 1)
        door.answer(np.array(ids, np.uint64), [b"{}"], b"200 OK", [b"content-type: application/json\r\n"])
        assert waiting.result() == [(200, b"{}")]
