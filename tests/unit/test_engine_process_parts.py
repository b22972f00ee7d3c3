"""The engine process's parts that need no process: segments reused by size, errors kept whole, answers
written in whole buffers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from app.config import Settings
from app.engine_process import frames, host
from app.engine_process.segments import MIN_SEGMENT_BYTES, SegmentPool, map_file
from app.errors import GpuDecodeError, QueueFullError, ServiceError


def test_segments_are_sized_by_power_of_two_reused_and_unlinked(tmp_path: Path) -> None:
    pool = SegmentPool(tmp_path)
    small, new = pool.take(10)
    assert new and small.size == MIN_SEGMENT_BYTES
    big, new = pool.take(150_528 * 32)  # 32 ResNet-50 images of uint8
    assert new and big.size == 1 << 23
    small.memory[:3] = b"abc"
    seen = map_file(small.path, small.size, create=False)  # what the engine process maps
    assert seen[:3] == b"abc"
    seen.close()
    pool.give_back(big)
    again, new = pool.take(150_528 * 30)  # same size class: the same segment, nothing to announce
    assert again is big and not new
    other, new = pool.take(150_528 * 30)  # the first is lent: a second one
    assert new and other.index == 2
    pool.close()
    assert list(tmp_path.iterdir()) == []


def test_an_engine_error_reaches_the_worker_with_its_status_code_and_headers() -> None:
    error = QueueFullError(900, 512, retry_after_s=0.25)
    again = frames.EngineProcessError(frames.error_payload(error))
    assert (again.status, again.code, again.reason) == (503, "overloaded", "queue_full")
    assert again.message == error.message and again.expected == error.expected
    assert again.headers == {"Retry-After": "1", "Retry-After-Ms": "250"}
    assert again.body() == error.body()


def test_the_engine_process_builds_the_jpeg_decoder_its_settings_ask_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's JPEG decoder lives with the GPU: the workers send it their uploads (UPLOADS frames)."""
    decoders: list[str] = []

    class Recorder:
        def __init__(self, settings: Settings, **_: object) -> None:
            decoders.append(settings.jpeg_decoder)
            self.settings, self.on_install = settings, []

        def start(self) -> None:
            raise RuntimeError("recorded")

    monkeypatch.setattr(host, "Service", Recorder)
    with pytest.raises(RuntimeError, match="recorded"):
        asyncio.run(host.serve_engines(Settings(jpeg_decoder="auto"), "unused.sock", lambda: None, lambda: None))
    assert decoders == ["auto"]


class RecordingWriter:
    """A StreamWriter's calls, as the transport would receive them."""

    def __init__(self) -> None:
        self.buffers: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.buffers.append(bytes(data))

    def writelines(self, data: tuple[bytes | memoryview, ...]) -> None:
        self.buffers.extend(bytes(item) for item in data)


@pytest.mark.parametrize("outcome", ["refused", "failed", "answered"])
def test_a_result_frame_hands_the_transport_no_empty_buffer(outcome: str) -> None:
    """Python 3.12's own socket transport keeps an empty buffer of a writelines queued and its write handler
    spinning (a review of 3c3c799 reproduced it): every RESULT reaches the writer as whole buffers."""
    writer = RecordingWriter()
    connection = host.WorkerConnection.__new__(host.WorkerConnection)
    connection.writer = writer  # type: ignore[assignment]
    scores = np.ones((2, 10), np.float32)
    answers = {
        "refused": {"error": GpuDecodeError("refused")},
        "failed": {"error": ServiceError("no")},
        "answered": {"scores": scores},
    }
    connection.answer(7, None, **answers[outcome])  # type: ignore[arg-type]
    assert writer.buffers and all(writer.buffers)
    kind, length = frames.PREFIX.unpack_from(writer.buffers[0])
    assert kind == frames.RESULT and length == sum(map(len, writer.buffers)) - frames.PREFIX.size
