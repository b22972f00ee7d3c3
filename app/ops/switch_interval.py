"""How long a thread that wants the GIL waits before the thread holding it must hand it over.

A server process is one event loop and a few helper threads: the CUDA event waiter (a batch that
outlasts the loop's polling), the GPU JPEG decoder's launches, grpcio's poller, the off-loop pool.
Each gives the GIL up in every call that waits (a torch call, an event's synchronize) and needs it
back to go on; while the loop holds it, that thread waits until the loop blocks in its poll or
for CPython's switch interval, 5 ms by default. Under load the loop rarely blocks, so a helper's
every step can cost up to 5 ms: in run 24c a JPEG batch took ~14 ms from launch to host for
~2.3 ms of work (~10 ms at 1 ms). With 1 ms in every server process, same run, JPEG photos through the engine
process's decoder went from 4,875 to 6,882 img/s at 256 connections (+41 %) and 5,193 to 7,116
at 1024 (+37 %). A forced hand-over costs microseconds and happens only while two threads want
the GIL at once.
"""

from __future__ import annotations

import sys


def set_switch_interval(ms: float) -> None:
    sys.setswitchinterval(ms / 1000)
