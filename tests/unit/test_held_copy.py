"""app/ops/held_copy.py: numpy's values in every case, held where it can be, numpy's copy (and errors) elsewhere."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.ops import held_copy
from app.ops.held_copy import HOLD_BELOW_BYTES, copy_holding_gil

rng = np.random.default_rng(0)
u8 = np.uint8


def ints(shape: tuple[int, ...], dtype: Any = u8) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=dtype)


HELD = {  # the GIL kept: C-contiguous numbers of one dtype and shape, below HOLD_BELOW_BYTES
    "row": (np.zeros((1, 3, 224, 224), u8), ints((1, 3, 224, 224))),
    "float32": (np.zeros((2, 3, 4, 4), np.float32), rng.random((2, 3, 4, 4), dtype=np.float32)),
    "bool": (np.zeros(7, bool), rng.random(7) > 0.5),
    "big-endian": (np.zeros(5, ">i4"), np.arange(5, dtype=">i4")),
}
NUMPYS = {  # numpy's copy
    "empty": (np.zeros((0, 3, 4, 4), u8), np.zeros((0, 3, 4, 4), u8)),
    "strided source": (np.zeros((2, 4, 4, 3), u8), ints((2, 3, 4, 4)).transpose(0, 2, 3, 1)),
    "cast": (np.zeros((2, 3, 4, 4), np.float32), ints((2, 3, 4, 4))),
    "broadcast": (np.zeros((2, 3, 4, 4), u8), ints((1, 3, 4, 4))),
    "large": (np.zeros(HOLD_BELOW_BYTES, u8), ints((HOLD_BELOW_BYTES,))),
    "objects": (np.empty(3, object), np.array([[1], [2], None], dtype=object)),  # pointers: numpy counts references
    "datetimes": (np.zeros(3, "M8[s]"), np.array([1, 2, 3], "M8[s]")),
}


def counting_copyto(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = np.copyto

    def copyto(dst: np.ndarray, src: np.ndarray) -> None:
        calls.append(1)
        real(dst, src)

    monkeypatch.setattr(held_copy.np, "copyto", copyto)
    return calls


@pytest.mark.parametrize("case", [*HELD, *NUMPYS])
def test_copy_holding_gil_gives_numpys_values_holding_it_where_it_can(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst, src = (HELD | NUMPYS)[case]
    expected = dst.copy()
    np.copyto(expected, src)
    calls = counting_copyto(monkeypatch)
    copy_holding_gil(dst, src)
    np.testing.assert_array_equal(dst, expected)
    assert calls == ([] if case in HELD else [1])


def test_a_row_of_a_larger_array_is_written_in_place() -> None:
    block = np.zeros((4, 3, 8, 8), u8)
    row = ints((1, 3, 8, 8))
    copy_holding_gil(block[2:3], row)
    assert (block[2:3] == row).all() and not block[[0, 1, 3]].any()


def test_a_read_only_destination_is_refused_as_numpy_refuses_it() -> None:
    dst = np.zeros(4, u8)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        copy_holding_gil(dst, np.ones(4, u8))
