"""Keep the garbage collector's full collections short: freeze the start-up heap.

CPython's full (generation 2) collection walks every tracked object. Once the models are loaded
that is some 200k objects — torch, FastAPI, pydantic, the model and its engine — none of which
will ever be garbage. Requests keep promoting short-lived objects into generation 2, so under
load a full collection came more than once a second (23 in 14 s), each stopping the event loop
for 0.1–0.5 s: the periodic p99 stalls at 70 % load (issue 11; bench/stall_ab.py,
bench/results/2026-11-30-run12a-x2-stalls.json).

gc.freeze() moves every object alive now into a permanent generation that collections skip;
objects created later are collected as before. Instagram's Django servers do the same. Called
once start-up is over (every model built), after a collection so no garbage is frozen with it.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze everything alive; returns how many objects are now frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
