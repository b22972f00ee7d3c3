"""bench/stage_trace.py's summary of a stage timeline around a moment."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from bench.stage_trace import show


def test_show_sums_each_kind_by_the_slice_its_events_end_in(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    events = [
        {"kind": "batch", "start": 99.990, "end": 99.995, "n": 32},  # ends in the slice before the moment
        {"kind": "jpeg_launch", "start": 99.960, "end": 100.004, "n": 90},  # a 44 ms decode ending just after it
        {"kind": "batch", "start": 100.001, "end": 100.006, "n": 16},
        {"kind": "loop_late", "start": 100.0, "end": 100.030, "n": 0},  # the loop 30 ms late: ends in +30
        {"kind": "batch", "start": 100.5, "end": 100.51, "n": 8},  # outside the window
    ]
    trace.write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = show(trace, [100.0], around_s=0.03).splitlines()
    assert lines[0].startswith("== around 100.000")
    by_slice = {int(line.split()[0]): line for line in lines[1:]}
    assert sorted(by_slice) == [-30, -20, -10, 0, 10, 20]  # the 30 ms after the moment's +30 is past the window
    assert "batch 1/32/5.0" in by_slice[-10]
    assert "jpeg_launch 1/90/44.0" in by_slice[0] and "batch 1/16/5.0" in by_slice[0]
    assert "loop_late" not in "".join(lines) and "8/" not in "".join(lines)


def test_numpy_copies_put_numpys_copy_where_the_held_one_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from app.batching import shares
    from app.engine_process import client
    from bench import stage_trace

    modules: list[Any] = [shares, client]
    with contextlib.suppress(ImportError):  # the GPU decoder's, where torchvision is installed
        from app.codecs import gpu_jpeg

        modules.append(gpu_jpeg)
    for module in modules:
        monkeypatch.setattr(module, "copy_holding_gil", module.copy_holding_gil)  # put back after the test
    stage_trace._numpy_copies()
    assert all(module.copy_holding_gil is np.copyto for module in modules)
