"""app/front_door's Python parts without a server: the bulk answers are encode_predictions' bytes for any
model, a v2 request's header is checked as the HTTP port checks it, a bulk's latencies land in the buckets one
observe each would, a missing compiler is a clear error, the service is not ready before the door is open, and the
feeder's bulks are answered, refused and given back as they should be, a partial one at the batcher's moment; and a
bulk's image uploads are decoded over their rows and answered as the port answers them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from PIL import Image
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from app.codecs.bodies import encode_predictions
from app.config import DEFAULT_REPOSITORY, Settings
from app.errors import GpuDecodeError, ServiceError
from app.front_door import library
from app.front_door.answers import Answers, head_lines
from app.front_door.door import IMAGE, JPEG, PREDICT, V2, Bulk
from app.front_door.v2_headers import V2Headers
from app.ops import metric_buffers
from app.ops.metric_buffers import BufferedHistogram
from app.protocols.v2.rest import Asked, V2Codec
from app.protocols.v2.tensors import Wanted
from app.repository import load_model, read_repository
from app.repository.model_spec import ModelSpec
from app.service import Service
from tests.output_models import write_repository
from tests.seed_model import seed_spec


def specs(folder: Path) -> list[ModelSpec]:
    """The seed CNN (class scores) and every model of named outputs tests/output_models.py writes."""
    return [seed_spec(), *(load_model(spec).spec for spec in read_repository(write_repository(folder)))]


def test_bulk_answers_are_encode_predictions_bytes(tmp_path: Path) -> None:
    for spec in specs(tmp_path):
        check_bulk_answers(spec)


def check_bulk_answers(spec: ModelSpec) -> None:
    width = len(spec.class_names) if spec.layout.default else spec.layout.width
    scores = np.random.default_rng(0).random((5, width), dtype=np.float32)
    mine, heads = Answers(SimpleNamespace(spec=spec), "cuda-graph", None)(scores, None)  # type: ignore[arg-type]
    theirs = [encode_predictions(scores[i : i + 1], model=spec.name, engine="cuda-graph", spec=spec) for i in range(5)]
    assert mine == theirs and heads == [b"content-type: application/json\r\n"] * 5


def test_v2_answers_of_a_piece_are_the_codecs_row_by_row(tmp_path: Path) -> None:
    """Binary, JSON and top-k outputs, with and without ids, for every model shape: each row's body and header
    lines are what V2Codec.encode gives that row alone (the binary rows share one header built once)."""
    codec = V2Codec(SimpleNamespace(settings=Settings()))  # type: ignore[arg-type]
    for spec in specs(tmp_path):
        served = SimpleNamespace(spec=spec)
        answers = Answers(served, "cuda-graph", codec)  # type: ignore[arg-type]
        width = len(spec.class_names) if spec.layout.default else spec.layout.width
        scores = np.random.default_rng(1).random((12, width), dtype=np.float32)
        every = tuple(Wanted(name, 0, True) for name in spec.layout.names)
        kinds = [every, every[:1], tuple(Wanted(name, 0, False) for name in spec.layout.names)]
        if spec.layout.classes is not None:
            kinds.append((Wanted(spec.layout.classes.name, 3, True),))
        asked = [Asked(None if i % 3 else f'id-{i}"é', kinds[i % len(kinds)]) if i % 5 else None for i in range(12)]
        bodies, heads = answers(scores, asked)
        for i, wanted in enumerate(asked):
            if wanted is None:
                assert heads[i] == b"content-type: application/json\r\n", spec.name
                continue
            want = codec.encode(scores[i : i + 1], wanted, served, "cuda-graph")  # type: ignore[arg-type]
            assert (bodies[i], heads[i]) == (want.body, head_lines(want.headers)), (spec.name, wanted)
        assert answers._binary[every] is not None  # the shared header was used


def v2_header(shape: list[int], datatype: str = "UINT8", outputs: list[dict] | None = None, **more: Any) -> bytes:
    """A Triton client's JSON inference header for one binary input."""
    size = int(np.prod(shape)) * (1 if datatype in ("UINT8", "INT8") else 4)  # the binary section's bytes
    tensor = {"name": "input", "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}
    return orjson.dumps({"inputs": [tensor], **({"outputs": outputs} if outputs else {}), **more})


def test_v2_headers_are_what_the_http_port_makes_of_them() -> None:
    spec = seed_spec()
    known = V2Headers(V2Codec(SimpleNamespace(settings=Settings())), spec)  # type: ignore[arg-type]
    binary = [{"name": "probabilities", "parameters": {"binary_data": True}}]
    asked = known(v2_header([1, 1, 28, 28], outputs=binary, id="a"))
    assert isinstance(asked, Asked) and asked.id == "a" and asked.outputs[0].binary
    numbered = [known(v2_header([1, 1, 28, 28], outputs=binary, id=str(i))) for i in range(3000)]  # perf_analyzer's
    assert [a.id for a in numbered if isinstance(a, Asked)] == [str(i) for i in range(3000)]
    assert len(known.known_but_id) == 1 and not known.known  # checked once without its id, not 3,000 times
    too_long = known(v2_header([1, 1, 28, 28], id="x" * 10_000))
    assert isinstance(too_long, ServiceError) and "request id" in str(too_long)
    not_a_string = known(v2_header([1, 1, 28, 28], id=5))  # refused, as the HTTP port (and Triton) refuse it
    assert isinstance(not_a_string, ServiceError) and "the request id is a number" in str(not_a_string)
    plain = v2_header([1, 1, 28, 28], outputs=binary)
    assert known(plain) is known(plain) and plain in known.known
    bytes_input = v2_header([1, 1, 28, 28]).replace(b'"UINT8"', b'"BYTES"').replace(b"[1,1,28,28]", b"[1]")
    refusals = {
        bytes_input: "one UINT8 input",  # an encoded image: the HTTP port's decoders take it
        v2_header([1, 1, 28, 28], datatype="INT8"): "datatype is 'INT8'",  # what the HTTP port says of it
        v2_header([1, 1, 28, 28], outputs=[{"name": "logits"}]): "logits",  # what the HTTP port says of it
        b"{not json": "not valid JSON",
        v2_header([1, 1, 28, 28])[:-1] + b',"inputs":5}': "list of one tensor",
    }
    for header, says in refusals.items():
        error = known(header)
        assert isinstance(error, ServiceError) and says in str(error), (header, error)


def test_observe_many_equals_one_observe_each() -> None:
    values = np.array([0.001, 0.0049, 0.005, 0.0, -1.0, 0.5, 1.0, 7.5, 0.01, 123.0])
    one, many = CollectorRegistry(), CollectorRegistry()
    direct = Histogram("h", "h", buckets=(0.001, 0.005, 0.01, 0.1, 1.0), registry=one)
    buffered = BufferedHistogram(Histogram("h", "h", buckets=(0.001, 0.005, 0.01, 0.1, 1.0), registry=many))
    for value in values.tolist():
        direct.observe(value)
    buffered.observe_many(values)
    buffered.flush()

    def text(registry: CollectorRegistry) -> str:
        return "\n".join(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)

    assert text(many) == text(one)


def test_no_compiler_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("PATH", str(tmp_path))  # and no cc on it
    with pytest.raises(library.BuildError, match=r"no C compiler .* set front_door_library"):
        library.door_library(None)
    with pytest.raises(library.BuildError, match="is not a file"):
        library.door_library(tmp_path / "missing.so")


def test_readiness_waits_for_what_starts_with_the_models() -> None:
    """The front door opens after the models are ready (it needs the default model's shape): until it is open
    the service is not ready, or a client told "ready" would find its port closed."""

    async def scenario() -> None:
        service = Service(Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0))
        opening, opened = asyncio.Event(), asyncio.Event()

        async def slow_to_open() -> None:
            opening.set()
            await opened.wait()

        service.on_started.append(slow_to_open)
        service.start()
        await opening.wait()
        ready, detail = service.readiness()
        assert not ready and "front door" in detail
        opened.set()
        await service.wait_started()
        assert service.readiness() == (True, "ready")
        await service.stop()

    interval = sys.getswitchinterval()  # a started service sets its process's
    try:
        asyncio.run(scenario())
    finally:
        sys.setswitchinterval(interval)


DEFAULT_V2 = b"fashion-cnn\n"  # door.c's start of a V2 row's header: the model its path names, and a newline


class StandInDoor:
    """door.py's Door without the C side: bulks handed in by the test, answers kept."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.shape, self.bulks = shape, []  # (rows, ids, headers, kinds[, lengths]) each
        self.answers: list[tuple[int, bytes, bytes, bytes]] = []  # (id, status, head lines, body)
        self.released: list[int] = []
        self.taken = 0

    def waiting(self) -> tuple[int, int]:
        if not self.bulks:
            return 0, 0
        rows, kinds = self.bulks[0][0], self.bulks[0][3]
        return len(rows), 0 if kinds is None else int((kinds == JPEG).sum())

    def take(self) -> Bulk | None:
        if not self.bulks:
            return None
        rows, ids, headers, kinds, *lengths = self.bulks.pop(0)
        self.taken += 1  # each bulk its own buffer, as the C side's are while Python holds them
        if headers is not None and kinds is None:  # a v2 request where a header is, as the C side says of its rows
            kinds = np.array([V2 if header else PREDICT for header in headers], np.uint8)
        if headers is not None:  # a v2 request's model before its header, as its path names it (the default's here)
            headers = [DEFAULT_V2 + header if kind == V2 and b"\n" not in header else header
                       for kind, header in zip(kinds.tolist(), headers, strict=True)]  # fmt: skip
        return Bulk(self.taken, rows, ids, np.full(len(ids), time.monotonic()), headers, kinds, *lengths)

    def release(self, buffer: int) -> None:
        self.released.append(buffer)

    def answer(self, ids: np.ndarray, bodies: list[bytes], status: bytes, heads: list[bytes]) -> None:
        self.answers += [(int(i), status, h, body) for i, h, body in zip(ids, heads, bodies, strict=True)]


def feed(bulks: list[int], settings: dict[str, Any], break_answers: bool = False,
         headers: list[bytes] | None = None, kinds: np.ndarray | None = None, grpc: bool = False
         ) -> StandInDoor:  # fmt: skip
    """Bulks of that many seed-CNN images through a Feeder onto a real CPU batcher; the stand-in door, answered.
    `headers`: the first bulk's v2 headers (b"": a POST /predict), or its rows' headers of each of `kinds`; `grpc`:
    the feeder takes gRPC calls (their parts load the protocol's messages: front_door_grpc_checks.py's alone)."""
    from app.front_door.feeder import Feeder

    async def scenario() -> StandInDoor:
        service = Service(Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0, **settings))
        service.start()
        await service.wait_started()
        try:
            door = StandInDoor((1, 28, 28))
            images = np.random.default_rng(0).integers(0, 256, (sum(bulks), 1, 28, 28), dtype=np.uint8)
            first = 0
            for k in bulks:
                ids = np.arange(first, first + k, dtype=np.uint64)
                first_bulk = first == 0
                door.bulks.append((images[first : first + k], ids, headers if first_bulk else None,
                                   kinds if first_bulk else None))  # fmt: skip
                first += k
            rows = None
            if grpc:
                from app.front_door.grpc_calls import GrpcRows

                rows = GrpcRows(service)
            feeder = Feeder(door, service, (1, 28, 28), service.settings, rows)  # type: ignore[arg-type]
            if break_answers:  # each model's answers raise
                made = feeder.models._model
                feeder.models._model = lambda *parts: dataclasses.replace(made(*parts), answers=lambda *_: 1 / 0)  # type: ignore[method-assign]
            latest = time.monotonic() + 30  # a bulk never given back fails the test's assertions, not hangs it
            while (door.bulks or feeder.out) and time.monotonic() < latest:
                feeder.pump()
                await asyncio.sleep(0.01)
            return door
        finally:
            await service.stop()

    interval = sys.getswitchinterval()
    try:
        return asyncio.run(scenario())
    finally:
        sys.setswitchinterval(interval)


def door_waits_counted(model: str) -> float:
    metric_buffers.flush()
    return REGISTRY.get_sample_value("cgserve_front_door_wait_seconds_count", {"model": model}) or 0.0


def test_a_bulk_larger_than_a_batch_is_answered_row_by_row_and_given_back() -> None:
    waits = door_waits_counted(seed_spec().name)
    door = feed([300, 5], {"buckets": "1,8,128"})  # 300 rows: three pieces of at most 128
    assert sorted(i for i, *_ in door.answers) == list(range(305))
    assert {status for _, status, *_ in door.answers} == {b"200 OK"}
    assert sorted(door.released) == [1, 2]  # each bulk's buffer once, after its last piece
    assert door_waits_counted(seed_spec().name) - waits == 305  # each row's wait in the door, once


def test_a_full_queue_is_a_503_with_retry_after_for_each_row() -> None:
    door = feed([40], {"buckets": "1,8", "queue_limit": 16, "max_instances": 16})  # pieces of 8: some refused
    statuses = {status for _, status, *_ in door.answers}
    assert len(door.answers) == 40 and statuses <= {b"200 OK", b"503 Service Unavailable"}, statuses
    refused = [(head, body) for _, status, head, body in door.answers if status.startswith(b"503")]
    assert refused and all(b"retry-after: " in head and b'"overloaded"' in body for head, body in refused)
    assert door.released == [1]


def test_a_failure_while_answering_is_a_500_and_the_buffer_comes_back() -> None:
    door = feed([3], {}, break_answers=True)
    assert [status for _, status, *_ in door.answers] == [b"500 Internal Server Error"] * 3
    assert door.released == [1]


def test_a_bulk_of_both_routes_is_answered_each_as_asked() -> None:
    """POST /predict and v2 rows in one bulk: each gets its own route's answer; a header the HTTP port refuses is
    refused (in the v2 shape) and its row left out of the batch; the buffer comes back once."""
    binary = [{"name": "probabilities", "parameters": {"binary_data": True}}]
    headers = [b"", v2_header([1, 1, 28, 28], outputs=binary), v2_header([1, 1, 28, 28], datatype="FP32"),
               v2_header([1, 1, 28, 28], id="x")]  # fmt: skip
    door = feed([4], {}, headers=headers)
    answers = {i: (status, head, body) for i, status, head, body in door.answers}
    assert answers[0][0] == b"200 OK" and b'"predictions"' in answers[0][2]
    status, head, body = answers[1]
    length = int(head.split(b"inference-header-content-length: ")[1].split(b"\r\n")[0])
    assert status == b"200 OK" and b"application/octet-stream" in head and len(body) == length + 10 * 4
    assert orjson.loads(body[:length])["outputs"][0]["parameters"]["binary_data_size"] == 40
    status, head, body = answers[2]
    assert status == b"400 Bad Request" and isinstance(orjson.loads(body)["error"], str), body
    status, head, body = answers[3]
    assert (
        status == b"200 OK" and orjson.loads(body)["id"] == "x" and len(orjson.loads(body)["outputs"][0]["data"]) == 10
    )
    assert door.released == [1]


def test_a_partial_bulk_waits_for_a_launch_moment_sooner_than_a_timer_can_wait() -> None:
    """While a bulk is out, a partial one is taken at the batcher's launch moment, also where that is less than the
    event loop's timer resolution away (the seed CNN's batches take a fraction of a millisecond): not at once."""
    from app.front_door.feeder import TIMER_RESOLUTION_S, Feeder

    async def scenario() -> tuple[float, float | None]:
        door = StandInDoor((1, 28, 28))
        door.bulks.append((np.zeros((3, 1, 28, 28), np.uint8), np.arange(3, dtype=np.uint64), None, None))
        settings = Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0)
        feeder = Feeder(door, Service(settings), (1, 28, 28), settings)  # type: ignore[arg-type]
        moment = time.monotonic() + TIMER_RESOLUTION_S / 3
        feeder.batcher = SimpleNamespace(launch_moment=lambda: moment)  # type: ignore[assignment]
        feeder.pieces[99] = 1  # another bulk is out
        taken: list[float] = []
        took = asyncio.Event()

        def queued(bulk: Bulk) -> None:
            taken.append(time.monotonic())
            took.set()

        feeder._queue = queued  # type: ignore[method-assign]
        feeder.pump()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(took.wait(), 1.0)
        return moment, taken[0] if taken else None

    moment, taken = asyncio.run(scenario())
    assert taken is not None, "the partial bulk was never taken"
    assert taken >= moment, f"taken {(moment - taken) * 1e6:.0f} µs before the launch moment"


def uploads_bulk(bodies: list[bytes], kinds: list[int], pixels: np.ndarray) -> tuple:
    """A stand-in bulk as door.c fills it: each upload's bytes at the start of its row, a POST /predict's pixels
    (`pixels`, (1, 28, 28) uint8) where its kind is PREDICT (its body then b"")."""
    rows = np.zeros((len(bodies), 1, 28, 28), np.uint8)
    for row, body, kind in zip(rows, bodies, kinds, strict=True):
        if kind == PREDICT:
            row[:] = pixels
        else:
            row.reshape(-1)[: len(body)] = np.frombuffer(body, np.uint8)
    lengths = np.array([len(body) if kind != PREDICT else 784 for body, kind in zip(bodies, kinds, strict=True)],
                       np.int32)  # fmt: skip
    return rows, np.arange(len(bodies), dtype=np.uint64), [b""] * len(bodies), np.array(kinds, np.uint8), lengths


def garment_file(garment: np.ndarray, form: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(garment).save(buffer, form, optimize=True)
    return buffer.getvalue()


def run_feeder(door: StandInDoor, settings: Settings, until: Any, prepare: Any = None) -> None:
    """`door`'s bulks through a Feeder onto a real CPU batcher, pumped until `until(door, feeder)`; `prepare(feeder)`
    first, where given."""
    from app.front_door.feeder import Feeder

    async def scenario() -> None:
        service = Service(settings)
        service.start()
        await service.wait_started()
        try:
            feeder = Feeder(door, service, (1, 28, 28), service.settings)  # type: ignore[arg-type]
            if prepare is not None:
                prepare(feeder)
            latest = time.monotonic() + 30
            while not until(door, feeder) and time.monotonic() < latest:
                feeder.pump()
                await asyncio.sleep(0.01)
        finally:
            await service.stop()

    interval = sys.getswitchinterval()
    try:
        asyncio.run(scenario())
    finally:
        sys.setswitchinterval(interval)


def test_a_bulks_uploads_are_decoded_over_their_rows_and_answered_as_the_port_does() -> None:
    """Pixels, a PNG and a JPEG of one garment, and junk, in one bulk (Pillow decodes here: no GPU): the PNG's row
    is the pixels' row, so its answer is theirs (to float rounding: it rides a later batch); the junk gets the port's
    422, alone; the buffer comes back once."""
    garment = load_garment()
    png, jpeg = garment_file(garment, "PNG"), garment_file(garment, "JPEG")
    door = StandInDoor((1, 28, 28))
    door.bulks.append(uploads_bulk([b"", png, jpeg, b"junk" * 20], [PREDICT, IMAGE, JPEG, IMAGE], garment[None]))
    settings = Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0)
    run_feeder(door, settings, until=lambda door, feeder: len(door.answers) == 4 and not feeder.out)
    answers = {i: (status, body) for i, status, _, body in door.answers}
    assert [answers[i][0][:3] for i in range(4)] == [b"200"] * 3 + [b"422"], answers[3]
    pixels, from_png, from_jpeg = (orjson.loads(answers[i][1])["predictions"][0] for i in range(3))
    # Lossless: the pixels' row, in a later batch (the pixels go at once, an upload once decoded): float rounding apart.
    assert from_png["label"] == pixels["label"]
    np.testing.assert_allclose(from_png["scores"], pixels["scores"], rtol=1e-4, atol=1e-9)
    assert from_jpeg["label"] == pixels["label"]
    assert b"could not be decoded" in answers[3][1]
    assert door.released == [1]


def test_a_bulk_of_uploads_none_decodable_or_failing_after_its_decode_is_answered_and_given_back() -> None:
    """Every upload junk: each its own 422, the buffer back once. A fault once the uploads are decoded (the queueing
    raises): each a 500, the buffer back once, not a bulk left out for ever."""
    door = StandInDoor((1, 28, 28))
    door.bulks.append(uploads_bulk([b"junk" * 20, b"\x89PNG" + b"x" * 30], [IMAGE, IMAGE], load_garment()[None]))
    settings = Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0)
    run_feeder(door, settings, until=lambda door, feeder: len(door.answers) == 2 and not feeder.out)
    assert [status[:3] for _, status, *_ in door.answers] == [b"422"] * 2 and door.released == [1]

    def broken(feeder: Any) -> None:
        def enqueue(*_: Any) -> None:
            raise RuntimeError("a fault after the decode")

        feeder._enqueue = enqueue

    png = garment_file(load_garment(), "PNG")
    door = StandInDoor((1, 28, 28))
    door.bulks.append(uploads_bulk([png, png], [IMAGE, IMAGE], load_garment()[None]))
    run_feeder(door, settings, until=lambda door, feeder: len(door.answers) == 2 and not feeder.out, prepare=broken)
    assert [status[:3] for _, status, *_ in door.answers] == [b"500"] * 2 and door.released == [1]


class HeldDecoder:
    """The GPU decoder's stand-in: each JPEG's future waits until the test hands it back, its pixels the garment's."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels  # (1, 1, 28, 28)
        self.waiting: list[tuple[asyncio.Future[np.ndarray], np.ndarray]] = []

    def decode(self, data: Any, spec: Any, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        assert out is not None  # the door's rows are written in place
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.waiting.append((future, out))
        return future

    def hand_back(self, n: int, refuse: bool = False) -> None:
        """The first n waiting, as one decoder batch hands back: all in one turn of the loop (`refuse`: as nvJPEG
        refusing them, GpuDecodeError). A cancelled one is not written, as the decoder's hand-back skips it."""
        for future, out in self.waiting[:n]:
            if future.done():
                continue
            if refuse:
                future.set_exception(GpuDecodeError("not a JPEG the hardware decoder takes"))
            else:
                out[...] = self.pixels
                future.set_result(out)
        del self.waiting[:n]

    def close(self) -> None:
        pass


class PacedHeldDecoder(HeldDecoder):
    """A HeldDecoder that says when it has caught up, as the GPU decoder does (app/codecs/uploads.py's PacedDecoder):
    the uploads given it are its backlog until the test launches them."""

    def __init__(self, pixels: np.ndarray) -> None:
        super().__init__(pixels)
        self.unlaunched = 0
        self.on_caught_up: Any = None
        self.launches = 2

    def decode(self, data: Any, spec: Any, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        self.unlaunched += 1
        return super().decode(data, spec, out)

    def backlog(self) -> int:
        return self.unlaunched

    def launch_all(self) -> None:
        self.unlaunched = 0
        asyncio.get_running_loop().call_soon(self.on_caught_up)


def held_bulk(kinds: list[int]) -> tuple[StandInDoor, HeldDecoder]:
    """A door holding one bulk of the garment, its pixels where `kinds` says PREDICT and its JPEG where JPEG, and the
    HeldDecoder that decodes the JPEGs when the test says (run_held gives it to the feeder)."""
    garment = load_garment()
    jpeg = garment_file(garment, "JPEG")
    door = StandInDoor((1, 28, 28))
    door.bulks.append(uploads_bulk([jpeg if kind == JPEG else b"" for kind in kinds], kinds, garment[None]))
    return door, HeldDecoder(garment[None, None])


def run_held(door: StandInDoor, decoder: HeldDecoder, until: Any, prepare: Any = None, **settings: Any) -> None:
    """run_feeder on the seed CNN with `decoder` as the feeder's GPU decoder, and `prepare(feeder)` after."""
    from app.front_door.images import BulkImages

    def use_held(feeder: Any) -> None:
        feeder.images = BulkImages(decoder, 0, caught_up=feeder.pump)
        if prepare is not None:
            prepare(feeder)

    settings = {"model_repository": DEFAULT_REPOSITORY, "device": "cpu", "grpc_port": 0} | settings
    run_feeder(door, Settings(**settings), until, use_held)


def on_release(door: StandInDoor, look: Any) -> list[bool]:
    """What `look()` said at each of the door's releases of a buffer."""
    seen: list[bool] = []
    release = door.release

    def released(buffer: int) -> None:
        seen.append(look())
        release(buffer)

    door.release = released  # type: ignore[method-assign]
    return seen


def test_a_bulks_uploads_are_queued_a_decoder_batch_at_a_time_as_they_are_handed_back() -> None:
    """Four JPEGs in one bulk, decoded in two batches: the first batch's two are answered while the other two are still
    being decoded (they do not wait for the whole bulk's decode), then those two; the buffer comes back once."""
    door, decoder = held_bulk([JPEG] * 4)
    seen: list[list[int]] = []  # the rows answered when the second batch was handed back

    def step(door: StandInDoor, feeder: Any) -> bool:
        if len(decoder.waiting) == 4:
            decoder.hand_back(2)
        elif len(decoder.waiting) == 2 and len(door.answers) == 2:
            seen.append(sorted(int(i) for i, *_ in door.answers))
            decoder.hand_back(2)
        return len(door.answers) == 4 and not feeder.out

    run_held(door, decoder, until=step)
    assert seen == [[0, 1]], (seen, door.answers)
    assert [status[:3] for _, status, *_ in door.answers] == [b"200"] * 4
    assert door.released == [1]


@pytest.mark.parametrize("second", [[JPEG, JPEG], [JPEG, PREDICT]], ids=["jpegs", "a-jpeg-and-pixels"])
@pytest.mark.parametrize("paced", [True, False], ids=["decoder-says-when-caught-up", "decoder-says-nothing"])
def test_a_bulk_with_jpegs_is_taken_once_the_decoder_has_caught_up(paced: bool, second: list[int]) -> None:
    """in_flight 1, a bulk of two JPEGs out being decoded, a second bulk holding a JPEG waiting in the door (with
    another JPEG, or pixels: one other row must not hold it back): once the decoder has taken the first bulk's uploads
    into a launch, the second is taken, before the first is answered; a decoder that does not say when it has caught
    up leaves it in the door until the first bulk is answered (run 41's wait)."""
    garment = load_garment()
    jpeg = garment_file(garment, "JPEG")
    door = StandInDoor((1, 28, 28))
    door.bulks.append(uploads_bulk([jpeg, jpeg], [JPEG, JPEG], garment[None]))
    door.bulks.append(uploads_bulk([jpeg if kind == JPEG else b"" for kind in second], second, garment[None]))
    decoder = (PacedHeldDecoder if paced else HeldDecoder)(garment[None, None])
    taken: list[int] = []  # the bulks the door had given each time the decoder handed back

    def step(door: StandInDoor, feeder: Any) -> bool:
        if isinstance(decoder, PacedHeldDecoder) and decoder.unlaunched == 2 and door.taken == 1:
            decoder.launch_all()  # the first bulk's uploads taken into a launch: the decoder has caught up
        elif decoder.waiting:
            taken.append(door.taken)
            decoder.hand_back(len(decoder.waiting))
        return len(door.answers) == 4 and not feeder.out

    run_held(door, decoder, until=step, in_flight=1)
    assert [status[:3] for _, status, *_ in door.answers] == [b"200"] * 4
    assert sorted(door.released) == [1, 2]
    assert taken == ([2] if paced else [1, 2]), taken  # paced: both bulks with the decoder before either's answer


def test_a_bulk_stopped_while_decoding_answers_each_request_once_and_gives_its_buffer_back() -> None:
    """Pixels and three JPEGs; the first JPEG handed back, then the bulk's decoding cancelled (the server stopping):
    the pixels and that JPEG are answered by the model, the other two 503, none twice, the buffer back once."""
    door, decoder = held_bulk([PREDICT, JPEG, JPEG, JPEG])

    def step(door: StandInDoor, feeder: Any) -> bool:
        if len(decoder.waiting) == 3:
            decoder.hand_back(1)
        elif len(door.answers) == 2 and feeder.decoding:
            next(iter(feeder.decoding)).cancel()
        return len(door.answers) >= 4 and not feeder.out

    run_held(door, decoder, until=step)
    answers = {i: status[:3] for i, status, *_ in door.answers}
    assert len(door.answers) == 4 and answers == {0: b"200", 1: b"200", 2: b"503", 3: b"503"}, door.answers
    assert door.released == [1]
    assert all(future.cancelled() for future, _ in decoder.waiting)  # no decode left to write over a released row


def test_a_fault_while_a_bulk_decodes_cancels_its_decodes_before_its_buffer_goes_back() -> None:
    """Three JPEGs; the first decoder batch's row handed back, and queueing it raises: every request answered 500
    once, and by the time the buffer is released no decode is left to write over its rows (the door refills them)."""
    door, decoder = held_bulk([JPEG] * 3)
    stopped = on_release(door, lambda: all(future.done() for future, _ in decoder.waiting))

    def broken(feeder: Any) -> None:
        def enqueue(*_: Any) -> None:
            raise RuntimeError("a fault while queueing")

        feeder._enqueue = enqueue

    def step(door: StandInDoor, feeder: Any) -> bool:
        if len(decoder.waiting) == 3:
            decoder.hand_back(1)
        return len(door.answers) >= 3 and not feeder.out

    run_held(door, decoder, until=step, prepare=broken)
    assert sorted((i, status[:3]) for i, status, *_ in door.answers) == [(0, b"500"), (1, b"500"), (2, b"500")]
    assert stopped == [True], "the buffer went back while a decode could still write over its rows"


def test_a_decoder_that_refuses_a_bulks_third_jpeg_outright_leaves_none_of_its_decodes_running() -> None:
    """The decoder raises at the third JPEG of a bulk (not a future's error: the call itself): the two it took are
    cancelled before the buffer goes back, and all three requests are answered 500 once."""
    door, decoder = held_bulk([JPEG] * 3)
    held = decoder.decode

    def decode(data: Any, spec: Any, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        if len(decoder.waiting) == 2:
            raise RuntimeError("the decoder is gone")
        return held(data, spec, out)

    decoder.decode = decode  # type: ignore[method-assign]
    stopped = on_release(door, lambda: len(decoder.waiting) == 2 and all(f.cancelled() for f, _ in decoder.waiting))
    run_held(door, decoder, until=lambda door, feeder: len(door.answers) >= 3 and not feeder.out)
    assert sorted((i, status[:3]) for i, status, *_ in door.answers) == [(0, b"500"), (1, b"500"), (2, b"500")]
    assert stopped == [True]


class RowWritingHeldDecoder(HeldDecoder):
    """A HeldDecoder whose device writes pinned rows, as the GPU decoder's does into the door's buffers: a decode
    launched stays able to write its row until the test lands its batch, cancelled or not (`settled`)."""

    def __init__(self, pixels: np.ndarray) -> None:
        super().__init__(pixels)
        self.launched = 0  # rows in a batch the "device" may still write, until land()
        self.landed: asyncio.Event | None = None

    def decode(self, data: Any, spec: Any, out: np.ndarray | None = None) -> asyncio.Future[np.ndarray]:
        if self.landed is None:
            self.landed = asyncio.Event()  # on the test's loop
        return super().decode(data, spec, out)

    def land(self) -> None:
        self.launched = 0
        assert self.landed is not None
        self.landed.set()

    def pin(self, rows: np.ndarray) -> bool:
        return True

    def unpin(self, rows: np.ndarray) -> None:
        pass

    async def settled(self) -> None:
        if self.launched:
            assert self.landed is not None
            await self.landed.wait()

    def abandon_pinned(self) -> None:
        raise AssertionError("not stopping the door here")


def test_a_bulk_stopped_while_a_launched_batch_may_write_its_rows_keeps_its_buffer_until_that_batch_lands() -> None:
    """Three JPEGs launched onto a device that writes their pinned rows directly; the bulk's decoding cancelled (the
    server stopping) before they come back: each request is answered 503 once, and the buffer goes back only once the
    batch has landed, for the device could still write its rows until then (the door refills them)."""
    door, held = held_bulk([JPEG] * 3)
    decoder = RowWritingHeldDecoder(held.pixels)
    stopped = on_release(door, lambda: decoder.launched == 0)
    turns_since_cancel: list[int] = []

    def step(door: StandInDoor, feeder: Any) -> bool:
        if len(decoder.waiting) == 3 and not turns_since_cancel:
            decoder.launched = 3
            next(iter(feeder.decoding)).cancel()
            turns_since_cancel.append(0)
        elif turns_since_cancel:
            turns_since_cancel[0] += 1
            if turns_since_cancel[0] == 5:  # the "device" lands the batch a few turns after the cancel
                assert door.released == [], "the buffer went back while a launched batch could write its rows"
                decoder.land()
        return len(door.answers) >= 3 and bool(door.released) and not feeder.out

    run_held(door, decoder, until=step)
    assert sorted((i, status[:3]) for i, status, *_ in door.answers) == [(0, b"503"), (1, b"503"), (2, b"503")]
    assert door.released == [1] and stopped == [True]


def test_a_bulk_of_pixels_whose_queueing_faults_is_answered_and_given_back() -> None:
    """Pixels only; grouping them by model raises: each request 500, the buffer back, the bulk no longer out."""
    door = StandInDoor((1, 28, 28))
    door.bulks.append(uploads_bulk([b"", b""], [PREDICT, PREDICT], load_garment()[None]))
    settings = Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0)

    def broken(feeder: Any) -> None:
        def groups(*_: Any) -> None:
            raise RuntimeError("a fault before queueing")

        feeder.models.groups = groups

    run_feeder(door, settings, until=lambda door, feeder: len(door.answers) == 2 and not feeder.out, prepare=broken)
    assert [status[:3] for _, status, *_ in door.answers] == [b"500"] * 2 and door.released == [1]


def test_a_jpeg_nvjpeg_refuses_at_the_front_door_is_decoded_by_pillow_and_counted_so() -> None:
    """Two JPEGs, the decoder's batch refusing one (GpuDecodeError) and decoding the other: both answered 200 with
    the garment's label, counted once as gpu and once as cpu_fallback, as the service's port counts them."""
    door, decoder = held_bulk([JPEG] * 2)

    def count(decoder: str) -> float:
        return REGISTRY.get_sample_value("cgserve_image_decodes_total", {"decoder": decoder}) or 0.0

    before = {name: count(name) for name in ("gpu", "cpu", "cpu_fallback")}

    def step(door: StandInDoor, feeder: Any) -> bool:
        if len(decoder.waiting) == 2:
            decoder.hand_back(1, refuse=True)
            decoder.hand_back(1)
        return len(door.answers) == 2 and not feeder.out

    run_held(door, decoder, until=step)
    assert [status[:3] for _, status, *_ in door.answers] == [b"200"] * 2, door.answers
    assert {orjson.loads(body)["predictions"][0]["label"] for *_, body in door.answers} == {9}
    assert {name: count(name) - before[name] for name in before} == {"gpu": 1, "cpu": 0, "cpu_fallback": 1}


def load_garment() -> np.ndarray:
    from models.fashion_mnist import load_test_sample

    return load_test_sample()[0][0]  # (28, 28) uint8


class UnpinningDecoder:
    """A RowWritingDecoder that records what the door's stop asks of it; `settles` False: its batches never land."""

    def __init__(self, settles: bool = True) -> None:
        self.settles, self.calls = settles, []  # type: ignore[var-annotated]

    def decode(self, data: Any, spec: Any, out: np.ndarray | None = None) -> Any:
        raise AssertionError("not decoding here")

    def close(self) -> None:
        pass

    def pin(self, rows: np.ndarray) -> bool:
        return True

    def unpin(self, rows: np.ndarray) -> None:
        self.calls.append(("unpin", rows.shape[0]))

    async def settled(self) -> None:
        self.calls.append(("settled", None))
        if not self.settles:
            await asyncio.Event().wait()

    def abandon_pinned(self) -> None:
        self.calls.append(("abandon", None))


@pytest.mark.parametrize("case", ["settles", "device dead", "never settles"])
def test_the_doors_stop_unpins_its_buffers_only_once_no_decode_can_write_them(case: str) -> None:
    """FrontDoor.stop's last step: a bulk still decoding is stopped and awaited (it waits for its own launched
    batches), then every launched batch; only then each pinned buffer is unregistered (then C frees them). With
    the device dead, or batches that outlast the timeout, nothing is unregistered and the door is not freed."""
    from app.front_door.server import FrontDoor

    async def scenario() -> tuple[bool, list[Any], bool]:
        decoder = UnpinningDecoder(settles=case != "never settles")
        stopped = asyncio.Event()

        async def decoding() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                decoder.calls.append(("bulk stopped", None))
                stopped.set()

        task = asyncio.ensure_future(decoding())
        await asyncio.sleep(0)
        door = object.__new__(FrontDoor)
        door.service = types.SimpleNamespace(jpeg_decoder=decoder, device_dead=case == "device dead")  # type: ignore[assignment]
        door.feeder = types.SimpleNamespace(decoding={task})  # type: ignore[assignment]
        task.add_done_callback(door.feeder.decoding.discard)  # as Feeder._decoded does
        door.pinned = [np.zeros((4, 1, 2, 2), np.uint8), np.zeros((5, 1, 2, 2), np.uint8)]
        unpinned = await door._unpinned(0.2)
        calls, bulk_stopped = list(decoder.calls), stopped.is_set()
        task.cancel()
        return unpinned, calls, bulk_stopped

    unpinned, calls, bulk_stopped = asyncio.run(scenario())
    if case == "settles":
        assert unpinned and calls == [("bulk stopped", None), ("settled", None), ("unpin", 4), ("unpin", 5)]
    elif case == "device dead":
        assert not unpinned and calls == [] and not bulk_stopped
    else:
        assert not unpinned and calls == [("bulk stopped", None), ("settled", None), ("abandon", None)]


class UnpinRecordingDecoder(HeldDecoder):
    """A HeldDecoder that records, at each unpin, how many of its decodes are still live."""

    def __init__(self, pixels: np.ndarray) -> None:
        super().__init__(pixels)
        self.calls: list[str] = []

    def pin(self, rows: np.ndarray) -> bool:
        return True

    def unpin(self, rows: np.ndarray) -> None:
        self.calls.append(f"unpin with {sum(not future.done() for future, _ in self.waiting)} live decodes")

    async def settled(self) -> None:
        self.calls.append("settled")

    def abandon_pinned(self) -> None:
        self.calls.append("abandon")


def test_the_doors_stop_takes_no_bulk_while_it_unpins() -> None:
    """Two bulks of JPEGs, the second held in C by in_flight 1. The door's stop closes the feeder, then stops the
    bulk still decoding: that bulk's end, which pumps, takes no other (its decodes would be given to the decoder
    after the stop had waited for the launched batches), and no decode is live when the buffers are unpinned."""
    from app.front_door.feeder import Feeder
    from app.front_door.images import BulkImages
    from app.front_door.server import FrontDoor

    async def scenario() -> tuple[bool, list[str], int, int]:
        service = Service(Settings(model_repository=DEFAULT_REPOSITORY, device="cpu", grpc_port=0, in_flight=1))
        service.start()
        await service.wait_started()
        try:
            garment = load_garment()
            jpeg = garment_file(garment, "JPEG")
            door = StandInDoor((1, 28, 28))
            for _ in range(2):
                door.bulks.append(uploads_bulk([jpeg, jpeg], [JPEG, JPEG], garment[None]))
            decoder = UnpinRecordingDecoder(garment[None, None])
            feeder = Feeder(door, service, (1, 28, 28), service.settings)  # type: ignore[arg-type]
            feeder.images = BulkImages(decoder, 0, caught_up=feeder.pump)
            feeder.pump()
            for _ in range(5):
                await asyncio.sleep(0)
            assert door.taken == 1 and len(decoder.waiting) == 2  # the second bulk held back by in_flight 1
            front = object.__new__(FrontDoor)
            front.service = types.SimpleNamespace(jpeg_decoder=decoder, device_dead=False)  # type: ignore[assignment]
            front.feeder, front.pinned = feeder, [np.zeros((4, 1, 28, 28), np.uint8)]
            feeder.close()  # as FrontDoor.stop does once its drain is over
            unpinned = await front._unpinned(1.0)
            return unpinned, decoder.calls, door.taken, len(feeder.decoding)
        finally:
            await service.stop()

    unpinned, calls, taken, decoding = asyncio.run(scenario())
    assert unpinned and taken == 1 and decoding == 0
    # The stopped bulk waits for its launched batches (BulkImages.decode), then the stop for every batch.
    assert calls == ["settled", "settled", "unpin with 0 live decodes"]
