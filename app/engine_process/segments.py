"""Shared-memory segments for request pixels: a worker writes, the engine process reads.

Each segment is a file in a per-service folder under /dev/shm, mapped by both processes. A
worker lends one per frame (the requests it sends together), sized to the next power of two of the frame's bytes
(64 KiB at least), and takes it back only when the engine process has answered (it reads the pixels until it has
staged them), so a frame whose clients went away still holds its segment until then. Freed segments
are reused by size, so a steady load creates no files after its first second.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

MIN_SEGMENT_BYTES = 1 << 16


@dataclass(eq=False)
class Segment:
    index: int
    path: str
    size: int
    memory: mmap.mmap


def map_file(path: str, size: int, *, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)  # the mapping keeps the file open


class SegmentPool:
    """A worker's segments: lent per frame, given back once answered, unlinked at close."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._free: dict[int, list[Segment]] = defaultdict(list)  # size → segments not lent
        self.segments: list[Segment] = []  # by index: the engine process knows them by it

    def take(self, nbytes: int) -> tuple[Segment, bool]:
        """A segment of at least nbytes, and whether it is new (the engine process must be told)."""
        size = max(MIN_SEGMENT_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        if self._free[size]:
            return self._free[size].pop(), False
        index = len(self.segments)
        path = str(self.folder / f"w{os.getpid()}-{index}")
        segment = Segment(index, path, size, map_file(path, size, create=True))
        self.segments.append(segment)
        return segment, True

    def give_back(self, segment: Segment) -> None:
        self._free[segment.size].append(segment)

    def close(self) -> None:
        for segment in self.segments:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
                segment.memory.close()
            Path(segment.path).unlink(missing_ok=True)
        self.segments.clear()
        self._free.clear()
