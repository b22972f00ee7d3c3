"""app/ops/held_copy.py: the same values as numpy's copy, in every case it is given."""

from __future__ import annotations

import numpy as np
import pytest

from app.ops.held_copy import HOLD_BELOW_BYTES, copy_holding_gil

rng = np.random.default_rng(0)


@pytest.mark.parametrize(
    ("dst", "src"),
    [
        (np.zeros((1, 3, 224, 224), np.uint8), rng.integers(0, 256, (1, 3, 224, 224), dtype=np.uint8)),  # a row
        (np.zeros((2, 3, 4, 4), np.float32), rng.random((2, 3, 4, 4), dtype=np.float32)),
        (np.zeros((0, 3, 4, 4), np.uint8), np.zeros((0, 3, 4, 4), np.uint8)),  # an empty share
        (np.zeros((2, 4, 4, 3), np.uint8), rng.integers(0, 256, (2, 3, 4, 4), dtype=np.uint8).transpose(0, 2, 3, 1)),
        (np.zeros((2, 3, 4, 4), np.float32), rng.integers(0, 256, (2, 3, 4, 4), dtype=np.uint8)),  # numpy casts
        (np.zeros((2, 3, 4, 4), np.uint8), rng.integers(0, 256, (1, 3, 4, 4), dtype=np.uint8)),  # and broadcasts
        (np.zeros(HOLD_BELOW_BYTES, np.uint8), rng.integers(0, 256, HOLD_BELOW_BYTES, dtype=np.uint8)),  # large
    ],
    ids=["row", "float32", "empty", "strided source", "cast", "broadcast", "large"],
)
def test_copy_holding_gil_gives_numpys_values(dst: np.ndarray, src: np.ndarray) -> None:
    expected = dst.copy()
    np.copyto(expected, src)
    copy_holding_gil(dst, src)
    np.testing.assert_array_equal(dst, expected)


def test_a_row_of_a_larger_array_is_written_in_place() -> None:
    block = np.zeros((4, 3, 8, 8), np.uint8)
    row = rng.integers(0, 256, (1, 3, 8, 8), dtype=np.uint8)
    copy_holding_gil(block[2:3], row)
    assert (block[2:3] == row).all() and not block[[0, 1, 3]].any()
