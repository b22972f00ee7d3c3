"""Bench variants only: every Python process started with this folder on PYTHONPATH (a server's
workers and engine process inherit it) sets the interpreter's switch interval from
CGSERVE_BENCH_SWITCH_INTERVAL_MS (no setting of the service's: it ignores the name), how long a
thread waiting for the GIL waits before it asks the holder to drop it (CPython's default 5 ms).
The engine process's helper threads (the GPU JPEG decoder's launches, the CUDA event waiter)
each need the GIL back after every torch call while its event loop holds it; this bounds that:

    --variants "switch1ms=PYTHONPATH=/tmp/site:.:bench/switch_interval,CGSERVE_BENCH_SWITCH_INTERVAL_MS=1"

(one_image.py starts a variant's next pair at ",CGSERVE_", so PYTHONPATH goes first; the server
runs from the repository root, which "." names.)
"""

import os
import sys

_ms = os.environ.get("CGSERVE_BENCH_SWITCH_INTERVAL_MS")
if _ms:
    sys.setswitchinterval(float(_ms) / 1000)
