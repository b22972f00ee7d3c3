"""Row copies made holding the GIL: a run of small copies that does not queue behind other threads' Python.

numpy gives the GIL up for each copy it makes (np.copyto, slice assignment, each input of np.concatenate) and must
win it back to go on. While another thread runs Python, winning it back waits out the switch interval
(CGSERVE_SWITCH_INTERVAL_MS, 1 ms). On the development machine, staging 128 one-image requests (a 150 KB copy each)
took 1.35 ms alone and 124 ms beside one thread running Python; holding the GIL, 2.7 ms
(bench/results/2026-12-05-cpu-gil-convoy.md). The server makes such runs: a JPEG decoder batch's hand-back on
the event loop, and the staging of a batch of one-image requests on a staging thread, a copy a photo each. Each
side's Python is the other's wait. On an H100 at 1024 connections of JPEG uploads (run 46a, against numpy's copies
in one run), the event loop was late past 10 ms 14 times rather than 23, at most 17 ms rather than 26, and
ResNet-50's batch p99 fell from 48 to 32 ms (bench/results/2026-12-05-run46-h100-door-jpeg-held-copies.md). A row
copies in ~10 µs, less than one wait for the GIL, and CPython's memoryview assignment is a memcpy that keeps it.
"""

from __future__ import annotations

import numpy as np

# A larger copy gives the GIL up as numpy does: one wait to win it back is worth its time to the other threads
# (1 MiB: ~70 µs at the convoy record's 19 MB in 1.35 ms).
HOLD_BELOW_BYTES = 2**20


def copy_holding_gil(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src, without giving the GIL up, where both are C-contiguous numbers (bool, integers, floats,
    complex: bytes that mean the same wherever they are, unlike an object's pointers) of one dtype and shape,
    smaller than HOLD_BELOW_BYTES, into a writable dst; numpy's copy (which casts, broadcasts, says what is wrong
    and gives the GIL up) otherwise."""
    if (0 < src.nbytes < HOLD_BELOW_BYTES and dst.shape == src.shape and dst.dtype == src.dtype
            and dst.dtype.kind in "biufc" and dst.flags.writeable
            and dst.flags.c_contiguous and src.flags.c_contiguous):  # fmt: skip
        dst.data.cast("B")[:] = src.data.cast("B")  # ndarray.data: a memoryview of its buffer
    else:
        np.copyto(dst, src)
