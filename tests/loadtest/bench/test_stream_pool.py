"""bench/stream_pool.py's grouping of names by stream, on the CPU (the bench itself needs a GPU)."""

from __future__ import annotations

from bench.stream_pool import shared


def test_names_of_one_stream_are_grouped_and_lone_ones_left_out() -> None:
    streams = {"engine": 7, "decoder": 9, "torchvision's decoder": 7, "outputs": 11}
    assert shared(streams) == [["engine", "torchvision's decoder"]]
    assert shared({"engine": 1, "decoder": 2}) == []
