"""Python's side of fake_cuda.c, the stand-in for CUDA's driver that app/front_door/launch.c opens where there is no
GPU: the library built, and stand-in launcher slots as an engine's launcher_handles() gives real ones. Used by
tests/integration/test_front_door_launch.py and bench/front_door/launcher_cpu.py."""

from __future__ import annotations

import ctypes
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.engines.cuda import LauncherHandles
from app.service import LAUNCHER_SLOTS as SLOTS  # launch.c's SLOTS

SOURCE = Path(__file__).with_name("fake_cuda.c")


class FakeGraph(ctypes.Structure):
    """fake_cuda.c's graph: launching it writes `rows` rows of scores from the pixels at `in_` into `out`."""

    _fields_ = [("in_", ctypes.c_void_p), ("out", ctypes.c_void_p), ("rows", ctypes.c_int),
                ("row_bytes", ctypes.c_int), ("width", ctypes.c_int)]  # fmt: skip


def build_fake_cuda(folder: Path) -> ctypes.CDLL:
    """fake_cuda.c built as libcuda.so.1 in `folder` and loaded globally, so that launch.c's dlopen("libcuda.so.1")
    finds it."""
    built = folder / "libcuda.so.1"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(SOURCE), "-o", str(built)],
                   check=True)  # fmt: skip
    fake = ctypes.CDLL(str(built), mode=ctypes.RTLD_GLOBAL)
    fake.fake_cuda_launches.restype = ctypes.c_long
    return fake


@dataclass
class StandInSlots:
    """Three slots' pinned-memory stand-ins, graphs and events, and the handles naming them. Keep it alive while a
    launcher is open on `handles`: they are its addresses."""

    handles: LauncherHandles
    held: list[Any] = field(default_factory=list)


def stand_in_slots(buckets: tuple[int, ...], shape: tuple[int, ...], width: int) -> StandInSlots:
    ins = [np.zeros((buckets[-1], *shape), np.uint8) for _ in range(SLOTS)]
    outs = [np.zeros((buckets[-1], width), np.float32) for _ in range(SLOTS)]
    graphs = [FakeGraph(i.ctypes.data, o.ctypes.data, b, i[0].nbytes, width)
              for i, o in zip(ins, outs, strict=True) for b in buckets]  # fmt: skip
    events = [ctypes.c_int() for _ in range(2 * SLOTS)]
    handles = LauncherHandles(stream=1, context=1, buckets=buckets, ins=[i.ctypes.data for i in ins],
                              outs=[o.ctypes.data for o in outs], graphs=[ctypes.addressof(g) for g in graphs],
                              starts=[ctypes.addressof(e) for e in events[:SLOTS]],
                              dones=[ctypes.addressof(e) for e in events[SLOTS:]], width=width)  # fmt: skip
    return StandInSlots(handles, [ins, outs, graphs, events])
