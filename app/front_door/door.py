"""door.c through ctypes: its threads serve the port; Python takes bulks of pixels and hands answers back.

ctypes releases the GIL for each foreign call, and every call here is per bulk, never per request.
"""

from __future__ import annotations

import ctypes
import itertools
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the engine's module imports torch: the door's layer only names the type
    from app.engines.cuda import LauncherHandles

MOST_ROWS = 1024  # a bulk's rows at most (the C side answers 503 past it); more than a batch's: pieces
MAX_V2_HEADER = 4096  # door.c's: a row's header at most (a v2 request's model and JSON header, a gRPC call's fields)
REFUSALS = 11  # door.c's refusal statuses (fd_refusal_code)
# gRPC's status codes by number: grpc.c's refusals are counted by code.
GRPC_CODE_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                   "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                   "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")  # fmt: skip
GRPC_CODES = len(GRPC_CODE_NAMES)
MAX_GETS = 1024  # door.h's: answers set at most (GETs, and gRPC's metadata calls)
# door.h's kinds of request: a bulk row's. An image upload's row holds its encoded bytes until decoded over them:
# JPEG where door.c found one nvJPEG takes, IMAGE for Pillow (app/front_door/images.py). A V2 row's header is its
# model as its path names it, b"\n", then its JSON inference header (model_and_header).
PREDICT, V2, GRPC, JPEG, IMAGE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Limits:
    """What the C side enforces for the connections and requests it serves (door.c's header)."""

    max_connections: int
    keepalive_s: float
    request_s: float  # a request's whole arrival, from its first byte
    tokens: tuple[str, ...]  # the inference tokens; none: requests need no token
    max_bytes: int  # bodies and gRPC messages being received at once (CGSERVE_MAX_INFLIGHT_BYTES)
    max_pixels: int  # an image upload's that nvJPEG is given (CGSERVE_MAX_IMAGE_PIXELS); past it, Pillow's 413


def _load(library: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library))
    lib.fd_open.restype = ctypes.c_void_p
    number, seconds, text, pointer = ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p
    count = ctypes.c_longlong
    lib.fd_open.argtypes = (number,) * 7 + (text, number, number, seconds, seconds, text, count, count)
    lib.fd_waiting.restype = ctypes.c_int
    lib.fd_waiting.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fd_buffer.restype = ctypes.c_void_p
    lib.fd_buffer.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fd_take.restype = ctypes.c_int
    lib.fd_take.argtypes = [ctypes.c_void_p] * 8
    lib.fd_release.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fd_answer.restype = None
    lib.fd_answer.argtypes = (pointer, number, pointer, pointer, pointer, text, text, pointer)
    lib.fd_counts.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fd_refusal_code.restype = ctypes.c_int
    lib.fd_refusal_code.argtypes = [ctypes.c_int]
    lib.fd_set_gets.restype = ctypes.c_int
    lib.fd_set_gets.argtypes = (pointer, number, pointer, pointer, pointer, pointer, pointer)
    lib.fd_direct_open.restype = ctypes.c_void_p
    lib.fd_direct_open.argtypes = (pointer, number, *(pointer,) * 6, pointer, pointer, number, text, pointer, text,
                                   text, text, seconds, ctypes.c_char_p)  # fmt: skip
    lib.fd_direct_figures.restype = None
    lib.fd_direct_figures.argtypes = (pointer, pointer, number, pointer, pointer, pointer, number, pointer, pointer)
    lib.fd_direct_close.restype = ctypes.c_int
    lib.fd_direct_close.argtypes = (pointer, pointer, seconds)
    lib.fd_direct_stop.restype = None
    lib.fd_direct_stop.argtypes = (pointer, pointer)
    lib.fd_direct_free.restype = None
    lib.fd_direct_free.argtypes = (pointer,)
    lib.fmt_f32.restype = ctypes.c_int
    lib.fmt_f32.argtypes = (ctypes.c_void_p, ctypes.c_float)  # a buffer of 32 bytes (the tests)
    lib.fd_drain.argtypes = [ctypes.c_void_p]
    lib.fd_close.argtypes = [ctypes.c_void_p]
    return lib


# What one read of the launcher's figures takes at most (launch.c keeps 2**20 latencies and 2**16 batches).
LAUNCHER_READ = 1 << 20
LAUNCHER_BATCHES_READ = 1 << 16


@dataclass(frozen=True)
class LauncherFigures:
    """launch.c's figures since the last read."""

    latencies: np.ndarray  # (n,) float64 seconds: each answer's, from its request's whole arrival
    rows: np.ndarray  # (m,) int32: each batch's rows
    buckets: np.ndarray  # (m,) int32: its bucket
    seconds: np.ndarray  # (m,) float32: its device time
    lost: int  # latencies not kept (the ring was full): the answers are counted, their latencies are not
    pending: int  # rows taken and not yet answered
    dead: str | None  # why the launcher stopped on a failed or hung batch, else None
    failed: int  # rows answered 503 since (their batch failed or outlived the batch timeout)
    batches_lost: int  # batches not kept (their ring was full): their rows are counted in `latencies`


@dataclass(frozen=True)
class Bulk:
    """Requests taken at once: their rows, read in place until the door is given `buffer` back."""

    buffer: int
    rows: np.ndarray  # (k, C, H, W) uint8
    ids: np.ndarray  # (k,) uint64: where each answer goes (door.h's id: a connection, and a gRPC call's stream)
    arrived: np.ndarray  # (k,) float64: time.monotonic() of each request's whole arrival
    headers: list[bytes] | None  # each v2 request's model and JSON header, each gRPC call's other fields; None: all
    # POST /predict
    kinds: np.ndarray | None = None  # (k,) uint8: PREDICT, V2, GRPC, JPEG or IMAGE; None: all /predict (headers too)
    lengths: np.ndarray | None = None  # (k,) int32: each row's bytes (an image upload's, at its row's start)


class Door:
    def __init__(self, library: Path, listener: socket.socket, *, threads: int, shape: tuple[int, int, int],
                 buffers: int, wake_fd: int, path: bytes, full_rows: int, limits: Limits,
                 grpc_listener: socket.socket | None = None) -> None:  # fmt: skip
        """`threads` C threads on `listener` take POST `path` with one (C, H, W) uint8 image as its body, and POST
        /v2/models/<model>/infer with one as the binary section after its JSON header (and, on `grpc_listener`,
        gRPC's ModelInfer with one as its raw_input_contents), and POST `path` with an encoded image of at most C×H×W
        bytes as its body (Content-Type image/jpeg or image/png), put at the start of its row for Python to decode.
        The eventfd `wake_fd` is written when a bulk turns non-empty and when it holds `full_rows`. `buffers`: bulks
        Python may hold at once, plus the one being filled."""
        self._lib = lib = _load(library)
        row_bytes = int(np.prod(shape))
        tokens = "\n".join(limits.tokens).encode()
        grpc_fd = -1 if grpc_listener is None else grpc_listener.fileno()
        self._door = lib.fd_open(listener.fileno(), grpc_fd, threads, row_bytes, MOST_ROWS, buffers, wake_fd, path,
                                 full_rows, limits.max_connections, limits.keepalive_s, limits.request_s, tokens,
                                 limits.max_bytes, limits.max_pixels)  # fmt: skip
        if not self._door:
            raise ValueError(f"the front door refused {threads} threads, {buffers} buffers or the path {path!r}")
        self._rows = []  # (MOST_ROWS, C, H, W) each: the C side's buffers, read in place
        for b in range(buffers):
            memory = (ctypes.c_uint8 * (MOST_ROWS * row_bytes)).from_address(lib.fd_buffer(self._door, b))
            self._rows.append(np.frombuffer(memoryview(memory), np.uint8).reshape(MOST_ROWS, *shape))
        self._ids = np.empty(MOST_ROWS, np.uint64)  # each request's connection: its generation << 32 | its fd
        self._arrived = np.empty(MOST_ROWS, np.float64)
        self._headers = ctypes.create_string_buffer(MOST_ROWS * MAX_V2_HEADER)
        self._header_ends = np.empty(MOST_ROWS, np.int32)
        self._kinds = np.empty(MOST_ROWS, np.uint8)
        self._lengths = np.empty(MOST_ROWS, np.int32)
        self._which = ctypes.c_int()
        self._jpegs = ctypes.c_int()
        self.refusal_codes = [lib.fd_refusal_code(i) for i in range(REFUSALS)]
        self._launcher: int | None = None  # launch.c's, where one is open

    @property
    def buffers(self) -> list[np.ndarray]:
        """The C side's buffers as (MOST_ROWS, C, H, W) uint8 arrays, each bulk's rows a prefix of one of them."""
        return self._rows

    def waiting(self) -> tuple[int, int]:
        """Rows in the bulk being filled, and how many of them are JPEGs for the GPU decoder (JPEG): one call,
        one take of the C side's lock."""
        if not self._door:
            return 0, 0
        rows = self._lib.fd_waiting(self._door, ctypes.byref(self._jpegs))
        return int(rows), self._jpegs.value

    def take(self) -> Bulk | None:
        """The bulk, if any. None also where every other buffer is held: its rows then wait in C until one is
        released."""
        if not self._door:
            return None
        k = self._lib.fd_take(self._door, self._ids.ctypes.data, self._arrived.ctypes.data, self._headers,
                              self._header_ends.ctypes.data, self._kinds.ctypes.data, self._lengths.ctypes.data,
                              ctypes.byref(self._which))  # fmt: skip
        if k <= 0:
            return None
        buffer, ends, kinds = self._which.value, self._header_ends[:k], self._kinds[:k]
        if not kinds.any():  # all POST /predict
            return Bulk(buffer, self._rows[buffer][:k], self._ids[:k].copy(), self._arrived[:k].copy(), None)
        joined = ctypes.string_at(self._headers, int(ends[-1]))  # each its header, a slice of these (.raw: 4 MiB)
        starts = [0, *ends[:-1].tolist()]
        headers = [joined[start:end] for start, end in zip(starts, ends.tolist(), strict=True)]
        return Bulk(buffer, self._rows[buffer][:k], self._ids[:k].copy(), self._arrived[:k].copy(), headers,
                    kinds.copy(), self._lengths[:k].copy())  # fmt: skip

    def release(self, buffer: int) -> None:
        if self._door:
            self._lib.fd_release(self._door, buffer)

    def answer(self, ids: np.ndarray, bodies: list[bytes], status: bytes, heads: list[bytes]) -> None:
        """Each request of `ids` its body and its head's lines past the status and content-length (whole header
        lines: "content-type: application/json\\r\\n"), written by the thread owning its connection. A gRPC
        call's: its response message (b"": an error) and its trailers' lines ("grpc-status: 0\\r\\n"); `status`
        is not sent."""
        if not self._door:  # closed: a batch that outlived the drain's timeout has nobody left to answer
            return
        body_ends, head_ends = _offsets(bodies), _offsets(heads)
        self._lib.fd_answer(self._door, len(ids), ids.ctypes.data, b"".join(bodies), body_ends.ctypes.data, status,
                            b"".join(heads), head_ends.ctypes.data)  # fmt: skip

    def set_gets(self, answers: list[tuple[bytes, bytes, bytes, bool]]) -> None:
        """The GETs the door answers itself, each (path, status and header lines, body, whether it asks for an
        inference token): e.g. (b"/v2/models/m", b"200 OK\\r\\ncontent-type: application/json\\r\\n", b"{…}",
        True). A gRPC call's: (its grpc_key, its trailers' lines, its response message, token). Set again, the
        list replaces the one before whole (door.c swaps it in at once)."""
        if len(answers) > MAX_GETS:
            raise ValueError(f"the front door answers at most {MAX_GETS} GETs, not {len(answers)}")
        if not self._door:
            return
        n = len(answers)
        paths = (ctypes.c_char_p * n)(*(path for path, _, _, _ in answers))
        heads = (ctypes.c_char_p * n)(*(head for _, head, _, _ in answers))
        bodies = (ctypes.c_char_p * n)(*(body for _, _, body, _ in answers))  # bytes, NULs and all: lengths below
        lengths = (ctypes.c_int * n)(*(len(body) for _, _, body, _ in answers))
        tokens = (ctypes.c_int * n)(*(int(token) for *_, token in answers))
        if not self._lib.fd_set_gets(self._door, n, paths, heads, bodies, lengths, tokens):
            # n is checked above and the lengths are len()s: a refusal is a fault
            raise ValueError("the front door refused the GET answers")

    def open_connections(self) -> int:
        return self.counts()[2] if self._door else 0

    def counts(self) -> tuple[int, dict[int, int], int, dict[int, int]]:
        """(requests taken, refusals by HTTP status, connections open, those of the refusals whose target was under
        /v2 by HTTP status): totals since the door opened, of one moment."""
        counts = self._counts()
        refused = {code: int(counts[1 + i]) for i, code in enumerate(self.refusal_codes)}
        v2 = {code: int(counts[2 + REFUSALS + GRPC_CODES + i]) for i, code in enumerate(self.refusal_codes)}
        return int(counts[0]), refused, int(counts[REFUSALS + 1]), v2

    def grpc_refusals(self) -> list[int]:
        """gRPC calls refused by the C side, by status code (0..16): totals since the door opened."""
        counts = self._counts()
        return [int(n) for n in counts[REFUSALS + 2 : REFUSALS + 2 + GRPC_CODES]]

    def _counts(self) -> ctypes.Array[ctypes.c_uint64]:
        counts = (ctypes.c_uint64 * (REFUSALS + 2 + GRPC_CODES + REFUSALS))()  # door.c's fd_counts says where
        if self._door:
            self._lib.fd_counts(self._door, counts)
        return counts

    def open_launcher(self, handles: LauncherHandles, prefix: bytes, names: list[bytes],
                      failure: tuple[bytes, bytes, bytes], timeout_s: float) -> None:  # fmt: skip
        """launch.c's thread started on `handles` (an engine's launcher slots): POST /predict's rows go to it from now
        on, answered with `prefix`, the label, names[label] and the scores (answers.py's predictions()); a batch
        that fails or outlives `timeout_s` answers `failure` (status, head lines, body). ValueError where C refuses."""
        n = len(handles.buckets)

        def addresses(values: list[int]) -> ctypes.Array[ctypes.c_void_p]:
            return (ctypes.c_void_p * len(values))(*values)

        error = ctypes.create_string_buffer(256)
        opened = self._lib.fd_direct_open(
            self._door, n, (ctypes.c_int * n)(*handles.buckets), addresses(handles.ins), addresses(handles.outs),
            addresses(handles.graphs), addresses(handles.starts), addresses(handles.dones), handles.stream,
            handles.context, handles.width, prefix, (ctypes.c_char_p * len(names))(*names), *failure, timeout_s, error,
        )  # fmt: skip
        if not opened:
            raise ValueError(f"the front door's launcher did not start: {error.value.decode(errors='replace')}")
        self._launcher = opened

    def launcher_figures(self) -> LauncherFigures | None:
        """What the launcher answered since the last call, also once it is closed (its last figures), until
        free_launcher; None where none is open."""
        if not self._launcher:
            return None
        lib, most, batches = self._lib, LAUNCHER_READ, LAUNCHER_BATCHES_READ
        latencies, rows = np.empty(most, np.float64), np.empty(batches, np.int32)
        buckets, seconds = np.empty(batches, np.int32), np.empty(batches, np.float32)
        counts, why = np.zeros(7, np.uint64), ctypes.create_string_buffer(256)
        lib.fd_direct_figures(self._launcher, latencies.ctypes.data, most, rows.ctypes.data, buckets.ctypes.data,
                              seconds.ctypes.data, batches, counts.ctypes.data, why)  # fmt: skip
        n, m = int(counts[0]), int(counts[1])
        return LauncherFigures(latencies[:n], rows[:m], buckets[:m], seconds[:m], int(counts[2]), int(counts[3]),
                               why.value.decode(errors="replace") if counts[4] else None, int(counts[5]),
                               int(counts[6]))  # fmt: skip

    def stop_launcher(self) -> None:
        """No row goes to the launcher from now on (the feeder's bulk takes them); what it holds it still answers.
        Returns at once: close_launcher waits for it."""
        if self._door and self._launcher:
            self._lib.fd_direct_stop(self._door, self._launcher)

    def close_launcher(self, timeout_s: float) -> bool:
        """stop_launcher, then its rows answered and its thread ended within `timeout_s`: False where a batch
        outlived it (its thread may still answer through the door, which must then not be freed). Blocks: call
        it off the event loop. Its last figures stay readable until free_launcher."""
        if not self._door or not self._launcher:
            return True
        return bool(self._lib.fd_direct_close(self._door, self._launcher, timeout_s))

    def free_launcher(self) -> None:
        """A closed launcher's buffers freed (where its thread ended); none is open from now on."""
        launcher, self._launcher = self._launcher, None
        if launcher:
            self._lib.fd_direct_free(launcher)

    def drain(self) -> None:
        """Stop accepting; answers close their connections from now on (idle ones at their keep-alive timeout)."""
        if self._door:
            self._lib.fd_drain(self._door)

    def close(self) -> None:
        """Every connection closed and the C side freed; from now on every call here does nothing."""
        self.free(self.detach())

    def detach(self) -> int | None:
        """From now on every call here does nothing; the C side, still open, to give free(). Called on the thread
        that makes the other calls (the event loop's), so that none of them sees the door open and then gone."""
        door: int | None = self._door
        self._door = None
        return door

    def free(self, door: int | None) -> None:
        """Every connection of a detached door closed and its C side freed, on any thread (it joins the door's)."""
        if door:
            self._lib.fd_close(door)


def model_and_header(header: bytes) -> tuple[str, str | None, bytes]:
    """A V2 row's header → (its model's name, the version its path names or None, its JSON inference header).
    door.c matched the path's name and version to the repository's characters: ASCII."""
    model, _, json = header.partition(b"\n")
    name, _, version = model.decode("ascii").partition("/versions/")
    return name, version or None, json


def _offsets(parts: list[bytes]) -> np.ndarray:
    """(len(parts) + 1,) int64: part i of their join is [offsets[i], offsets[i + 1])."""
    # fromiter over the running sum: under half of cumsum's time over a list, twice a piece answered on the event loop
    # (bench/door_answer_cost.py)
    return np.fromiter(itertools.accumulate(map(len, parts), initial=0), np.int64, len(parts) + 1)
