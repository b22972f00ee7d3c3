"""Host rows the GPU writes into directly: arrays registered with CUDA as pinned memory, and where a row lies in them.

The front door's bulks are (MOST_ROWS, C, h, w) uint8 arrays that C fills with uploads; the GPU JPEG decoder writes
each upload's pixels over its row. Copied out of the device into a pinned block of the decoder's own, every photo
then cost a host copy into its row on the event loop (a quarter of the loop's samples in run 47's profile:
bench/results/HISTORY.md). Registered once (cudaHostRegister), the rows themselves are what the device's copies
write: a run of consecutive rows is one DMA, and no host copy is left.

A registered array's pages are locked for as long as it stays registered: all of it is resident from then on, not
only the rows touched so far.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device's context, as torch's own pinning does


@dataclass(frozen=True, eq=False)
class Region:
    start: int  # the array's first byte's address
    end: int  # one past its last
    rows: torch.Tensor  # (n, C, h, w) uint8 over the array's memory, the device copies' destination
    row_bytes: int


@dataclass(frozen=True, slots=True)
class Place:
    region: Region
    row: int  # the row's index in region.rows


class PinnedRows:
    """The arrays registered so far, and for a (1, C, h, w) view which pinned row it is."""

    def __init__(self, cudart: Any = None) -> None:
        self._cudart = cudart  # torch.cuda.cudart() once first needed; tests give a stand-in
        self._regions: list[Region] = []  # by start address
        self._starts: list[int] = []

    def pin(self, rows: np.ndarray) -> bool:
        """Register `rows`, a C-contiguous (n, C, h, w) uint8 array that outlives its registration; False (logged,
        nothing registered) where CUDA refused it: its rows are then copied into as before."""
        if rows.dtype != np.uint8 or rows.ndim < 2 or not rows.flags.c_contiguous or not rows.nbytes:
            raise ValueError(f"pinned rows are a C-contiguous (n, ...) uint8 array; got {rows.dtype} {rows.shape}")
        start = rows.ctypes.data
        if self._find(start) is not None:
            return True  # already registered
        cudart = self._runtime()
        error = on_own_thread(partial(cudart.cudaHostRegister, start, rows.nbytes, REGISTER_PORTABLE))
        if error != 0:
            log.warning("could not register %d MB of rows as pinned memory (cudaError %d): they are copied into",
                        rows.nbytes >> 20, error)  # fmt: skip
            return False
        region = Region(start, start + rows.nbytes, torch.from_numpy(rows), rows[0].nbytes)
        i = bisect.bisect(self._starts, start)
        self._starts.insert(i, start)
        self._regions.insert(i, region)
        return True

    def unpin(self, rows: np.ndarray) -> None:
        """Unregister `rows` (nothing where it is not registered). The caller makes sure no copy still writes it."""
        i = self._find(rows.ctypes.data)
        if i is None or self._regions[i].start != rows.ctypes.data:
            return
        cudart, start = self._runtime(), self._starts.pop(i)
        on_own_thread(partial(cudart.cudaHostUnregister, start))
        del self._regions[i]

    def close(self) -> None:
        """Unregister every array still registered."""
        cudart = self._runtime()
        for region in list(self._regions):
            on_own_thread(partial(cudart.cudaHostUnregister, region.start))
        self._regions.clear()
        self._starts.clear()

    def __bool__(self) -> bool:
        return bool(self._regions)

    def place(self, out: np.ndarray) -> Place | None:
        """Where `out`, a (1, C, h, w) uint8 view, is one whole row of a registered array; None where it is not."""
        start = out.__array_interface__["data"][0]
        i = self._find(start)
        if i is None:
            return None
        region = self._regions[i]
        row, offset = divmod(start - region.start, region.row_bytes)
        if offset or out.nbytes != region.row_bytes or out.dtype != np.uint8 or not out.flags.c_contiguous:
            return None
        return Place(region, row)

    def _find(self, address: int) -> int | None:
        i = bisect.bisect(self._starts, address) - 1
        return i if i >= 0 and address < self._regions[i].end else None

    def _runtime(self) -> Any:
        if self._cudart is None:
            self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        return self._cudart


def on_own_thread(call: Callable[[], Any]) -> int:
    """A CUDA runtime call's error code, the call made on a thread of its own: the runtime keeps a refusal as the
    calling thread's last error, which torch's next kernel launch on that thread would read as its own
    (C10_CUDA_KERNEL_LAUNCH_CHECK); this thread ends with it."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(int(call())), name="cuda-host-register")
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
