"""The front door's rows grouped by model (app/front_door/models.py) through a real Feeder onto real CPU batchers:
a bulk's rows for one model are one group however they name it, two models taking turns are queued in two pieces,
not a piece a row; a version replaced is let go (the door keeps no batcher of its own)."""

from __future__ import annotations

import asyncio
import gc
import shutil
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from app.batching.batcher import Batcher
from app.config import Settings
from app.front_door.door import PREDICT, V2
from app.front_door.feeder import GATHER_ROW_BYTES, pieces_of
from app.model_control import ModelControl
from app.service import Service
from tests.unit.test_front_door_parts import StandInDoor, v2_header

ROOT = Path(__file__).resolve().parents[2]
HEADER = v2_header([1, 1, 28, 28])


def two_models(folder: Path) -> Path:
    """A repository of the seed CNN and its twin under another name: the same images."""
    for name in ("fashion-cnn", "fashion-twin"):
        shutil.copytree(ROOT / "models" / "repository" / "fashion-cnn", folder / name)
    return folder


def run(folder: Path, scenario: Callable[[Service, StandInDoor, Callable[..., Awaitable[None]]], Awaitable[None]]
        ) -> None:  # fmt: skip
    """`scenario(service, door, send)` with a Feeder on the stand-in door; `send(headers, kinds)` hands it one bulk
    of those rows and waits until every one is answered and the buffer is back."""
    from app.front_door.feeder import Feeder

    async def main() -> None:
        settings = Settings(model_repository=two_models(folder), device="cpu", grpc_port=0,
                            default_model="fashion-cnn", model_control="explicit", buckets=(1, 8, 64))  # fmt: skip
        service = Service(settings)
        service.start()
        await service.wait_started()
        door = StandInDoor((1, 28, 28))
        feeder = Feeder(door, service, (1, 28, 28), service.settings, None)  # type: ignore[arg-type]

        async def send(headers: list[bytes], kinds: list[int]) -> None:
            n = len(headers)
            door.answers.clear()
            door.bulks.append((np.zeros((n, 1, 28, 28), np.uint8), np.arange(n, dtype=np.uint64), headers,
                               np.array(kinds, np.uint8)))  # fmt: skip
            while door.bulks or feeder.out:
                feeder.pump()
                await asyncio.sleep(0.01)
            assert sorted(i for i, *_ in door.answers) == list(range(n))  # each answered once

        try:
            await scenario(service, door, send)
        finally:
            await service.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("names", "pieces"),
    [
        (["fashion-cnn"] * 64, 1),
        (["", "fashion-cnn"] * 32, 1),  # POST /predict and the default's v2 infer: one model, one run
        (["fashion-cnn", "fashion-cnn/versions/1"] * 32, 1),
        (["fashion-cnn", "fashion-twin"] * 32, 2),  # two models taking turns: each gathered, one piece each
        (["fashion-cnn"] * 30 + ["fashion-twin"] * 4 + ["fashion-cnn"] * 30, 3),  # a few runs: a view each
    ],
)
def test_a_models_rows_are_queued_in_few_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str],
                                                pieces: int) -> None:  # fmt: skip
    """Sixty-four rows naming models as listed ("": POST /predict): the batchers are given `pieces` pieces, where a
    piece a run of one model's rows made 64 of two models taking turns; each answer names its model."""
    enqueued: list[int] = []
    enqueue = Batcher.enqueue

    def counted(self: Batcher, rows: np.ndarray, deadline: float) -> asyncio.Future[np.ndarray]:
        enqueued.append(len(rows))
        return enqueue(self, rows, deadline)

    monkeypatch.setattr(Batcher, "enqueue", counted)

    async def scenario(service: Service, door: StandInDoor, send: Callable[..., Awaitable[None]]) -> None:
        headers = [name.encode() + b"\n" + HEADER if name else b"" for name in names]
        await send(headers, [V2 if name else PREDICT for name in names])
        assert len(enqueued) == pieces and sum(enqueued) == 64, enqueued
        for i, status, _, body in door.answers:
            assert status == b"200 OK"
            name = names[i].split("/")[0] or "fashion-cnn"
            assert f'"model_name":"{name}"'.encode() in body or f'"model":"{name}"'.encode() in body, body[:80]

    run(tmp_path, scenario)


def test_a_version_replaced_is_let_go_by_the_door(tmp_path: Path) -> None:
    """A model served through the door, then loaded again (model control): once the old version has retired, its
    batcher and engines are gone, not held by the door's parts of that model."""

    async def scenario(service: Service, door: StandInDoor, send: Callable[..., Awaitable[None]]) -> None:
        twin = b"fashion-twin\n" + HEADER
        await send([twin, twin], [V2, V2])
        old = service.model("fashion-twin")
        assert old.batcher is not None
        gone = weakref.ref(old.batcher)
        control = ModelControl(service)
        await control.load("fashion-twin")  # a new version beside it; the old one retires once idle
        await asyncio.gather(*(retiring.task for retiring in control._retiring))  # the old version retired
        await send([twin, twin], [V2, V2])  # through the new one
        del old
        gc.collect()
        assert gone() is None, [type(holder).__name__ for holder in gc.get_referrers(gone())]

    run(tmp_path, scenario)


def test_small_rows_are_gathered_and_large_ones_queued_a_run_at_a_time() -> None:
    """A model's rows in many runs: gathered into one copy where a row is small (the seed CNN's 784 bytes), a view a
    run where a row is a photo's pixels (150 KB: the copy would cost the event loop more than the pieces)."""
    taking_turns = np.arange(0, 64, 2)
    gathered = pieces_of(taking_turns, 784)
    assert len(gathered) == 1 and isinstance(gathered[0], np.ndarray) and (gathered[0] == taking_turns).all()
    assert len(pieces_of(taking_turns, 3 * 224 * 224)) == 32  # a slice a row
    assert 3 * 224 * 224 > GATHER_ROW_BYTES >= 784
    assert pieces_of(np.arange(10), 3 * 224 * 224) == [slice(0, 10)]  # one run: one view, whatever the size
