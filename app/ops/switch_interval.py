"""How long a thread that wants the GIL waits before the thread holding it must hand it over.

A server process is one event loop and a few helper threads: the CUDA event waiter (a batch that
outlasts the loop's polling), the GPU JPEG decoder's launches, grpcio's poller, the off-loop pool.
Each gives the GIL up in every call that waits (a torch call, an event's synchronize) and needs it
back to go on; while the loop holds it, that thread waits until the loop blocks in its poll or
for CPython's switch interval, 5 ms by default. Under load the loop rarely blocks, so a helper's
every step can cost up to the interval: a GPU JPEG batch, a handful of torch calls on its thread,
took several times its work on the device. A shorter interval bounds each wait; a forced hand-over
costs microseconds and happens only while two threads want the GIL at once. What it gave, measured:
bench/results/HISTORY.md, run 24.
"""

from __future__ import annotations

import sys


def set_switch_interval(ms: float) -> None:
    sys.setswitchinterval(ms / 1000)
