"""Row copies made holding the GIL: a run of small copies that does not queue behind other threads' Python.

numpy gives the GIL up for each copy it makes (np.copyto, slice assignment, each input of np.concatenate) and must
win it back to go on. While another thread runs Python, winning it back waits out the switch interval
(CGSERVE_SWITCH_INTERVAL_MS), so a run of a hundred small copies can take a hundred intervals. The server makes such
runs, a copy a photo each: a JPEG decoder batch's hand-back on the event loop, and the staging of a batch of
one-image requests on a staging thread. Each side's Python is the other's wait. A row copies in microseconds, less
than one wait for the GIL, and CPython's memoryview assignment is a memcpy that keeps it. What it saves, on the CPU
and on the GPU: bench/gil_convoy.py and bench/results/HISTORY.md.
"""

from __future__ import annotations

import numpy as np

# A larger copy gives the GIL up as numpy does: it runs long enough (tens of µs at memory speed) that one wait to
# win the GIL back is worth the other threads' time.
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
