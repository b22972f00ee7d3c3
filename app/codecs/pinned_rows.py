"""Host rows the GPU writes into directly: arrays registered with CUDA as pinned memory, and where a row lies in them.

The front door's bulks are (MOST_ROWS, C, h, w) uint8 arrays that C fills with uploads; the GPU JPEG decoder writes
each upload's pixels over its row. Copied out of the device into a pinned block of the decoder's own, every photo
then cost a host copy into its row on the event loop, where every other request's Python waits its turn
(bench/results/HISTORY.md, runs 47 and 48). Registered once (cudaHostRegister), the rows themselves are what the
device's copies write: a run of consecutive rows is one DMA, and no host copy is left.

A registered array's pages are locked for as long as it stays registered: all of it is resident from then on, not
only the rows touched so far.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device's context, not only the registering one


@dataclass(frozen=True, eq=False)
class Region:
    start: int  # the array's first byte's address
    end: int  # one past its last
    rows: torch.Tensor  # (n, C, h, w) uint8 over the array's memory, the device copies' destination
    row_bytes: int
    device: int | None  # the device whose context registered it (None: the caller's current one)


@dataclass(frozen=True, slots=True)
class Place:
    region: Region
    row: int  # the row's index in region.rows


class PinnedRows:
    """The arrays registered so far, and for a (1, C, h, w) view which pinned row it is. `place` runs on the decoder's
    launch threads while `pin` or `unpin` may run on another: the index is a new tuple each time, swapped in whole."""

    def __init__(self, cudart: Any = None) -> None:
        self._cudart = cudart  # torch.cuda.cudart() once first needed; tests give a stand-in
        self._index: tuple[tuple[int, ...], tuple[Region, ...]] = ((), ())  # start addresses, regions, by address

    def pin(self, rows: np.ndarray, device: int | None = None) -> bool:
        """Register `rows`, a C-contiguous (n, C, h, w) uint8 array that outlives its registration, from `device`'s
        context (None: the calling thread's current device); False (logged, nothing registered) where CUDA refused
        it: its rows are then copied into as before."""
        if rows.dtype != np.uint8 or rows.ndim < 2 or not rows.flags.c_contiguous or not rows.nbytes:
            raise ValueError(f"pinned rows are a C-contiguous (n, ...) uint8 array; got {rows.dtype} {rows.shape}")
        start = rows.ctypes.data
        if self._find(start) is not None:
            return True  # already registered
        cudart = self._runtime()
        error = on_own_thread(partial(cudart.cudaHostRegister, start, rows.nbytes, REGISTER_PORTABLE), device)
        if error != 0:
            log.warning("could not register %d MB of rows as pinned memory (cudaError %d): they are copied into",
                        rows.nbytes >> 20, error)  # fmt: skip
            return False
        region = Region(start, start + rows.nbytes, torch.from_numpy(rows), rows[0].nbytes, device)
        self._swap([*self._index[1], region])
        return True

    def unpin(self, rows: np.ndarray) -> None:
        """Unregister `rows` (nothing where it is not registered). The caller makes sure no copy still writes it."""
        i = self._find(rows.ctypes.data)
        regions = self._index[1]
        if i is None or regions[i].start != rows.ctypes.data:
            return
        self._swap([region for j, region in enumerate(regions) if j != i])  # no place() finds it from now on
        on_own_thread(partial(self._runtime().cudaHostUnregister, regions[i].start), regions[i].device)

    def close(self) -> None:
        """Unregister every array still registered."""
        regions = self._index[1]
        self._swap([])
        for region in regions:
            on_own_thread(partial(self._runtime().cudaHostUnregister, region.start), region.device)

    def __bool__(self) -> bool:
        return bool(self._index[1])

    def place(self, out: np.ndarray) -> Place | None:
        """Where `out`, a (1, C, h, w) uint8 view, is one whole row of a registered array; None where it is not."""
        start = out.__array_interface__["data"][0]
        starts, regions = self._index  # one snapshot: pin() or unpin() may swap it meanwhile
        i = bisect.bisect(starts, start) - 1
        if i < 0 or start >= regions[i].end:
            return None
        region = regions[i]
        row, offset = divmod(start - region.start, region.row_bytes)
        if offset or out.shape != (1, *region.rows.shape[1:]) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            return None
        return Place(region, row)

    def _find(self, address: int) -> int | None:
        starts, regions = self._index
        i = bisect.bisect(starts, address) - 1
        return i if i >= 0 and address < regions[i].end else None

    def _swap(self, regions: list[Region]) -> None:
        regions.sort(key=lambda region: region.start)
        self._index = (tuple(region.start for region in regions), tuple(regions))

    def _runtime(self) -> Any:
        if self._cudart is None:
            self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        return self._cudart


def on_own_thread(call: Callable[[], Any], device: int | None = None) -> int:
    """A CUDA runtime call's error code, the call made on a thread of its own with `device` current (None: the
    runtime's default): the runtime keeps a refusal as the calling thread's last error, which torch's next kernel
    launch on that thread would read as its own (C10_CUDA_KERNEL_LAUNCH_CHECK); this thread ends with it. A fresh
    thread's current device is 0, whose context a call made there would create on another GPU's host."""
    result: list[int] = []

    def run() -> None:
        with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
            result.append(int(call()))

    thread = threading.Thread(target=run, name="cuda-host-register")
    thread.start()
    thread.join()
    return result[0] if result else -1


def copy_runs(places: list[tuple[int, Place]]) -> list[tuple[Region, int, int, int]]:
    """(source row, Place) pairs, in source order → (region, first region row, first source row, rows) runs: rows
    consecutive on both sides are one copy."""
    runs: list[tuple[Region, int, int, int]] = []
    for source, place in places:
        if runs:
            region, first, first_source, n = runs[-1]
            if place.region is region and place.row == first + n and source == first_source + n:
                runs[-1] = (region, first, first_source, n + 1)
                continue
        runs.append((place.region, place.row, source, 1))
    return runs
