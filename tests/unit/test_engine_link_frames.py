"""A worker's link to the engine process sends its requests together: one INFER frame for the
requests of one loop iteration, at most FRAMES_IN_FLIGHT frames unanswered, and each request gets
back exactly its own rows. The engine process here is a fake on a real Unix socket that records
every frame and answers when the test says."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pytest

from app.engine_process import client, frames
from app.engine_process.client import FRAMES_IN_FLIGHT, EngineLink
from app.engine_process.segments import map_file
from app.errors import NotReadyError, QueueFullError

CLASSES = 3


@dataclass
class FakeEngineProcess:
    """Records each INFER frame's (id, rows, pixels) and answers it on `answer`: the scores of row r
    are [r's first pixel, 0, 0], so a request's answer shows which rows it got."""

    frames_seen: list[tuple[int, np.ndarray]] = field(default_factory=list)
    segments: dict[int, object] = field(default_factory=dict)
    writer: asyncio.StreamWriter | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        while True:
            try:
                kind, payload = await frames.read_frame(reader)
            except asyncio.IncompleteReadError:
                return
            if kind == frames.HELLO:
                models = {"m": {"1": {"id": 0, "engine": "eager", "devices": ["cpu"], "queue_limit": 1000}}}
                writer.write(frames.json_frame(frames.MODELS, {"models": models, "generation": 0}))
            elif kind == frames.SEGMENT:
                where = orjson.loads(payload)
                self.segments[where["index"]] = map_file(where["path"], where["size"], create=False)
            elif kind == frames.INFER:
                frame_id, _, dtype, _, k, c, h, w, segment = frames.INFER_HEADER.unpack(payload)
                pixels = np.ndarray((k, c, h, w), frames.DTYPES[dtype], buffer=self.segments[segment]).copy()  # type: ignore[call-overload]
                self.frames_seen.append((frame_id, pixels))
                self.arrived.set()

    def answer(self, frame_id: int, *, error: Exception | None = None) -> None:
        assert self.writer is not None
        if error is not None:
            body = frames.error_payload(error)  # type: ignore[arg-type]
            header = frames.RESULT_HEADER.pack(frame_id, 0, 0, 0, 0, 0.0)
        else:
            pixels = dict(self.frames_seen)[frame_id]
            scores = np.zeros((len(pixels), CLASSES), np.float32)
            scores[:, 0] = pixels.reshape(len(pixels), -1)[:, 0]
            body, header = scores.tobytes(), frames.RESULT_HEADER.pack(frame_id, 1, len(pixels), CLASSES, 0, 0.0)
        self.writer.write(frames.PREFIX.pack(frames.RESULT, len(header) + len(body)) + header + body)

    async def wait_frames(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.frames_seen) < count:
                self.arrived.clear()
                await self.arrived.wait()


@asynccontextmanager
async def linked(tmp_path: Path) -> AsyncIterator[tuple[EngineLink, FakeEngineProcess]]:
    fake = FakeEngineProcess()
    socket_path = str(tmp_path / "engine.sock")
    server = await asyncio.start_unix_server(fake.serve, path=socket_path)
    (tmp_path / "segments").mkdir()
    lost: list[str] = []
    link = EngineLink(socket_path, str(tmp_path / "segments"), on_dead=lost.append)
    await link.connect(timeout_s=5)
    try:
        yield link, fake
    finally:
        await link.close()
        server.close()


def image(first_pixel: int, rows: int = 1) -> np.ndarray:
    """(rows, 1, 2, 2) uint8, every pixel of row r = first_pixel + r."""
    return (np.arange(rows, dtype=np.uint8)[:, None, None, None] + first_pixel) * np.ones((1, 1, 2, 2), np.uint8)


def test_requests_of_one_loop_iteration_go_in_one_frame_and_get_their_own_rows(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with linked(tmp_path) as (link, fake):
            futures = [link.send(0, image(10), 1e9), link.send(0, image(20, rows=3), 1e9), link.send(0, image(30), 1e9)]
            await fake.wait_frames(1)
            ((frame_id, pixels),) = fake.frames_seen
            assert pixels.shape == (5, 1, 2, 2)  # 1 + 3 + 1 rows, in the order sent
            fake.answer(frame_id)
            answers = await asyncio.gather(*futures)
            assert [list(a[:, 0]) for a in answers] == [[10], [20, 21, 22], [30]]

    asyncio.run(scenario())


def test_at_most_frames_in_flight_then_the_waiting_go_together(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with linked(tmp_path) as (link, fake):
            first = []
            for i in range(FRAMES_IN_FLIGHT):  # one a loop iteration: a frame each
                first.append(link.send(0, image(i), 1e9))
                await fake.wait_frames(i + 1)
            waiting = [link.send(0, image(100 + i), 1e9) for i in range(5)]
            await asyncio.sleep(0.05)
            assert len(fake.frames_seen) == FRAMES_IN_FLIGHT, "a frame went out past the window"
            fake.answer(fake.frames_seen[0][0])
            await fake.wait_frames(FRAMES_IN_FLIGHT + 1)
            frame_id, pixels = fake.frames_seen[-1]
            assert len(pixels) == 5  # the five that waited, in one frame
            fake.answer(frame_id)
            for frame_id, _ in fake.frames_seen[1:FRAMES_IN_FLIGHT]:
                fake.answer(frame_id)
            answers = await asyncio.gather(*first, *waiting)
            assert [int(a[0, 0]) for a in answers] == [*range(FRAMES_IN_FLIGHT), *range(100, 105)]

    asyncio.run(scenario())


def test_a_refused_frame_fails_each_of_its_requests_with_the_engines_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with linked(tmp_path) as (link, fake):
            futures = [link.send(0, image(i), 1e9) for i in range(2)]
            await fake.wait_frames(1)
            fake.answer(fake.frames_seen[0][0], error=QueueFullError(900, 512, retry_after_s=0.5))
            errors = await asyncio.gather(*futures, return_exceptions=True)
            assert all(isinstance(e, frames.EngineProcessError) and e.status == 503 for e in errors)
            assert errors[0] is not errors[1]  # each its own, for its own traceback

    asyncio.run(scenario())


def test_a_request_cancelled_before_its_frame_left_is_not_sent(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with linked(tmp_path) as (link, fake):
            gone, kept = link.send(0, image(1), 1e9), link.send(0, image(2), 1e9)
            gone.cancel()
            await fake.wait_frames(1)
            assert fake.frames_seen[0][1][:, 0, 0, 0].tolist() == [2]
            fake.answer(fake.frames_seen[0][0])
            assert (await kept)[0, 0] == 2

    asyncio.run(scenario())


def test_requests_of_different_shapes_go_in_frames_of_their_own(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with linked(tmp_path) as (link, fake):
            small, large = link.send(0, image(1), 1e9), link.send(0, np.full((1, 1, 3, 3), 7, np.uint8), 1e9)
            await fake.wait_frames(2)
            assert sorted(p.shape for _, p in fake.frames_seen) == [(1, 1, 2, 2), (1, 1, 3, 3)]
            for frame_id, _ in fake.frames_seen:
                fake.answer(frame_id)
            assert (await small)[0, 0] == 1 and (await large)[0, 0] == 7

    asyncio.run(scenario())


def test_a_lost_engine_process_fails_what_was_sent_and_what_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "FRAMES_IN_FLIGHT", 1)

    async def scenario() -> None:
        async with linked(tmp_path) as (link, fake):
            sent = link.send(0, image(1), 1e9)
            await fake.wait_frames(1)
            waited = link.send(0, image(2), 1e9)  # the window is full: it waits in the outbox
            assert fake.writer is not None
            fake.writer.close()
            results = await asyncio.gather(sent, waited, return_exceptions=True)
            assert all(isinstance(r, NotReadyError) for r in results), results
            with pytest.raises(NotReadyError, match="engine process is gone"):
                link.send(0, image(3), 1e9)

    asyncio.run(scenario())
