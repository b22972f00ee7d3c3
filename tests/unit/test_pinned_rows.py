"""app/codecs/pinned_rows.py on the CPU: CUDA's registration stood in for, where a row lies and which copies a
batch's rows make (the device's copies themselves: tests/gpu/test_gpu_jpeg.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from app.codecs.pinned_rows import PinnedRows, copy_runs


class StandInCudart:
    """torch.cuda.cudart()'s two calls: what was registered, and on which thread; `refuse` makes registering fail."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.registered: dict[int, int] = {}  # address → bytes
        self.threads: set[str] = set()

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        self.threads.add(threading.current_thread().name)
        if self.refuse:
            return 2  # cudaErrorMemoryAllocation
        self.registered[address] = size
        return 0

    def cudaHostUnregister(self, address: int) -> int:
        self.threads.add(threading.current_thread().name)
        return 0 if self.registered.pop(address, None) is not None else 1


def bulks(n: int = 2) -> list[np.ndarray]:
    return [np.zeros((8, 3, 4, 5), np.uint8) for _ in range(n)]


def test_a_row_of_a_pinned_array_is_found_and_anything_else_is_not() -> None:
    cudart, (first, second) = StandInCudart(), bulks()
    pinned = PinnedRows(cudart)
    assert pinned.pin(first) and pinned.pin(second) and pinned
    assert cudart.registered == {first.ctypes.data: first.nbytes, second.ctypes.data: second.nbytes}
    place = pinned.place(second[5:6])
    assert place is not None and place.row == 5 and place.region.rows.data_ptr() == second.ctypes.data
    assert tuple(place.region.rows.shape) == second.shape
    assert pinned.place(np.zeros((1, 3, 4, 5), np.uint8)) is None  # another array
    assert pinned.place(first[2:4]) is None  # two rows: not one row
    assert pinned.place(first.reshape(-1)[1:61].reshape(1, 3, 4, 5)) is None  # not on a row's start
    assert pinned.place(first[2:3].reshape(1, 3, 5, 4)) is None  # a row's bytes in another shape


def test_registering_is_done_on_a_thread_of_its_own_and_a_refusal_leaves_nothing_registered() -> None:
    cudart = StandInCudart(refuse=True)
    pinned = PinnedRows(cudart)
    (rows,) = bulks(1)
    assert not pinned.pin(rows) and not pinned
    assert pinned.place(rows[0:1]) is None
    assert cudart.threads == {"cuda-host-register"}  # a refusal is that thread's last CUDA error, not the caller's


def test_unpin_and_close_unregister_what_was_registered_once() -> None:
    cudart, (first, second) = StandInCudart(), bulks()
    pinned = PinnedRows(cudart)
    pinned.pin(first)
    pinned.pin(first)  # already registered: not twice
    pinned.pin(second)
    pinned.unpin(first)
    pinned.unpin(first)  # no longer registered: nothing
    assert list(cudart.registered) == [second.ctypes.data] and pinned.place(first[0:1]) is None
    pinned.close()
    assert cudart.registered == {} and not pinned


def test_pinned_rows_must_be_one_contiguous_uint8_array() -> None:
    pinned = PinnedRows(StandInCudart())
    with pytest.raises(ValueError, match="C-contiguous"):
        pinned.pin(np.zeros((8, 3, 4, 5), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        pinned.pin(np.zeros((8, 3, 4, 5), np.uint8)[:, :, :, ::2])


def test_rows_consecutive_on_both_sides_are_one_copy() -> None:
    """A batch's group rows 0..5 whose outs are rows 3, 4, 5 and 7 of one bulk, then row 0 of another, then row 1 of
    the other again: four copies."""
    cudart, (first, second) = StandInCudart(), bulks()
    pinned = PinnedRows(cudart)
    pinned.pin(first)
    pinned.pin(second)
    outs = [first[3:4], first[4:5], first[5:6], first[7:8], second[0:1], second[1:2]]
    places = [(row, pinned.place(out)) for row, out in enumerate(outs)]
    runs = [(region.rows.data_ptr(), first_row, source, n) for region, first_row, source, n in
            copy_runs([(row, place) for row, place in places if place is not None])]  # fmt: skip
    a, b = first.ctypes.data, second.ctypes.data
    assert runs == [(a, 3, 0, 3), (a, 7, 3, 1), (b, 0, 4, 2)]


def test_a_gap_in_the_batchs_rows_breaks_a_run() -> None:
    """Outs consecutive in the bulk whose group rows are not (a row between them went elsewhere) are two copies."""
    (rows,) = bulks(1)
    pinned = PinnedRows(StandInCudart())
    pinned.pin(rows)
    places = [(0, pinned.place(rows[2:3])), (2, pinned.place(rows[3:4]))]
    assert [(first, source, n) for _, first, source, n in copy_runs(places)] == [(2, 0, 1), (3, 2, 1)]  # type: ignore[arg-type]
