"""The server with a timeline of its stages, to tell what a latency tail's stalls are (run 45).

    STAGE_TRACE=trace.jsonl python3 -m bench.stage_trace serve …   # as python3 -m app.cli serve …
    python3 -m bench.stage_trace show trace.jsonl --at 1234.5,1236.1 [--around 0.3]

Run 45's open loops at 70 % had their slowest 1 % packed into one to five 0.1 s bins (loadtest's tail_over_time),
not spread over the run: something stalls, and the server's histograms cannot say what or when. This wraps, for the
bench alone, the stages a JPEG upload passes through, each event one JSON line {"kind", "start", "end", "n"} with
times on time.monotonic() (CLOCK_MONOTONIC, the load generator's clock too: its record's window_start_monotonic_s
places its bins on this timeline):

  bulk        the feeder takes a bulk from the door: n rows, start = its oldest request's arrival
  rows        the same bulk, start = its requests' mean arrival
  later, engine, answer   the front door's other stages (_trace_door_path)
  jpeg_launch a decoder batch's decode, resize and copies out queued, on its launch thread: n photos
  jpeg_back   from that launch's start to its pixels handed back on the event loop
  batch       the model's batch: staged, replayed, answered (n rows)
  loop_late   the event loop ran a 5 ms sleep's wake-up late by more than 2 ms (start: when it was due)
  gc          a garbage collection (n: its generation)

With STAGE_TRACE_COPIES=numpy the server copies rows as it did before app/ops/held_copy.py (numpy's copies, giving
the GIL up for each): one run can set the two side by side (bench/one_image.py --stage-trace --variants
'numpy-copies=STAGE_TRACE_COPIES=numpy').

The wrapping reaches the server process alone: a server whose engines live there (the front door's design, or one
worker and no engine process). Spawned workers and an engine process import the app afresh, untraced.

A thread appends the events to the file every half second. `show` sums them, 10 ms at a time, around given moments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

LOOP_SAMPLE_S, LOOP_LATE_S, WRITE_EVERY_S = 0.005, 0.002, 0.5

_events: list[tuple[str, float, float, int]] = []  # appended from any thread: list.append holds the GIL


def _note(kind: str, start: float, end: float, n: int) -> None:
    _events.append((kind, start, end, n))


def _writer(path: Path) -> None:
    global _events
    with path.open("a") as out:
        while True:
            time.sleep(WRITE_EVERY_S)
            taken, _events = _events, []
            out.writelines(json.dumps({"kind": k, "start": s, "end": e, "n": n}) + "\n" for k, s, e, n in taken)
            out.flush()


async def _loop_lateness() -> None:
    while True:
        due = time.monotonic() + LOOP_SAMPLE_S
        await asyncio.sleep(LOOP_SAMPLE_S)
        if (late := time.monotonic() - due) > LOOP_LATE_S:
            _note("loop_late", due, due + late, 0)


def _numpy_copies() -> None:
    """Every module that copies rows with copy_holding_gil gets numpy's copy in its place."""
    import numpy as np

    from app.batching import shares
    from app.engine_process import client

    modules: list[Any] = [shares, client]
    with contextlib.suppress(ImportError):  # no torchvision: no GPU decoder
        from app.codecs import gpu_jpeg

        modules.append(gpu_jpeg)
    for module in modules:
        module.copy_holding_gil = np.copyto


def install(path: Path) -> None:
    """Wrap the stages (those this process has: the GPU decoder needs torchvision) and start the writer."""
    from app.batching.batcher import Batcher
    from app.front_door.feeder import Feeder

    if os.environ.get("STAGE_TRACE_COPIES") == "numpy":
        _numpy_copies()
    sampler: list[asyncio.Task[None]] = []  # the loop's sampler, started with the first batch (on the loop)

    run_batch = Batcher._run_batch

    @functools.wraps(run_batch)
    async def traced_batch(self: Any, lease: Any, shares: Any, rows: int, *args: Any, **kwargs: Any) -> None:
        if not sampler:
            sampler.append(asyncio.get_running_loop().create_task(_loop_lateness()))
        start = time.monotonic()
        try:
            await run_batch(self, lease, shares, rows, *args, **kwargs)
        finally:
            _note("batch", start, time.monotonic(), rows)

    Batcher._run_batch = traced_batch  # type: ignore[method-assign]

    queue = Feeder._queue

    @functools.wraps(queue)
    def traced_queue(self: Any, bulk: Any) -> None:
        taken = time.monotonic()
        _note("bulk", float(bulk.arrived.min()), taken, len(bulk.ids))
        _note("rows", float(bulk.arrived.mean()), taken, len(bulk.ids))
        queue(self, bulk)

    Feeder._queue = traced_queue  # type: ignore[method-assign]
    _trace_door_path(Feeder)

    try:
        from app.codecs.gpu_jpeg import GpuJpegDecoder
    except ImportError:  # no torchvision: no GPU decoder to time
        pass
    else:
        launch = GpuJpegDecoder._launch

        @functools.wraps(launch)
        def traced_launch(self: Any, jobs: list[Any]) -> Any:
            start = time.monotonic()
            try:
                return launch(self, jobs)
            finally:
                _note("jpeg_launch", start, time.monotonic(), len(jobs))

        GpuJpegDecoder._launch = traced_launch  # type: ignore[method-assign]
        hand_back = GpuJpegDecoder._hand_back

        @functools.wraps(hand_back)
        async def traced_hand_back(self: Any, launched: Any) -> None:
            try:
                await hand_back(self, launched)
            finally:  # from its launch's start: _Launched.started is time.perf_counter(), time.monotonic()'s clock
                _note("jpeg_back", launched.started, time.monotonic(), len(launched.jobs))

        GpuJpegDecoder._hand_back = traced_hand_back  # type: ignore[method-assign]

    collecting: dict[str, float] = {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting["start"] = time.monotonic()
        elif "start" in collecting:
            _note("gc", collecting.pop("start"), time.monotonic(), info["generation"])

    gc.callbacks.append(on_gc)
    threading.Thread(target=_writer, args=(path,), name="stage-trace", daemon=True).start()


def _trace_door_path(feeder: Any) -> None:
    """The front door's stages a request's time passes through between its bulk and its answer (issue 26 item 4),
    besides install's bulk and rows: later (a partial bulk held for the batcher's launch moment: now to that
    moment), engine (the engine's run: the graph's launch to its CUDA event seen), answer (a piece's answers built
    and handed to the door)."""
    from app.engines.cuda import CudaEngine

    later, answered = feeder._later, feeder._answered

    @functools.wraps(later)
    def traced_later(self: Any) -> bool:
        waiting = self.timer is not None  # held already: looked at again on this turn of the loop
        held = later(self)
        if held and not waiting and self.batcher is not None:
            _note("later", time.monotonic(), self.batcher.launch_moment(), 0)
        return bool(held)

    @functools.wraps(answered)
    def traced_answered(self: Any, buffer: int, model: Any, requests: Any, future: Any) -> None:
        start = time.monotonic()
        try:
            answered(self, buffer, model, requests, future)
        finally:
            _note("answer", start, time.monotonic(), len(requests))

    feeder._later, feeder._answered = traced_later, traced_answered
    run = CudaEngine.run

    @functools.wraps(run)
    async def traced_run(self: Any, slot: Any, bucket: int, dtype: Any) -> float:
        start = time.monotonic()
        try:
            return await run(self, slot, bucket, dtype)
        finally:
            _note("engine", start, time.monotonic(), bucket)

    CudaEngine.run = traced_run  # type: ignore[method-assign]


KINDS = ("bulk", "jpeg_launch", "jpeg_back", "batch", "loop_late", "gc", "rows", "later", "engine", "answer")


def summary(path: Path, skip_s: float = 1.0) -> str:
    """Per kind of event (after the first `skip_s` of the trace): how many, their mean n, their mean and p50/p90
    duration in ms; and the mean gap from each batch's end to the next answer's start (the loop's turn between)."""
    import numpy as np

    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not events:
        return "no events"
    first = min(e["end"] for e in events) + skip_s
    events = [e for e in events if e["end"] >= first]
    lines = []
    for kind in KINDS:
        picked = [e for e in events if e["kind"] == kind]
        if not picked:
            continue
        ms = np.array([(e["end"] - e["start"]) * 1e3 for e in picked])
        n = np.array([e["n"] for e in picked])
        lines.append(f"{kind}: {len(picked)} events, n mean {n.mean():.1f}, ms mean {ms.mean():.4f} "
                     f"p50 {np.percentile(ms, 50):.4f} p90 {np.percentile(ms, 90):.4f}")  # fmt: skip
    batches = sorted(e["end"] for e in events if e["kind"] == "batch")
    answers = np.array(sorted(e["start"] for e in events if e["kind"] == "answer"))
    if batches and len(answers):
        gaps = [answers[i] - end for end in batches if (i := int(np.searchsorted(answers, end))) < len(answers)]
        mean, p50 = np.mean(gaps) * 1e3, np.median(gaps) * 1e3
        lines.append(f"batch end → next answer start: ms mean {mean:.4f} p50 {p50:.4f}")
    span = max(e["end"] for e in events) - first
    lines.append(f"span {span:.2f} s")
    return "\n".join(lines)


def show(path: Path, moments: list[float], around_s: float, slice_s: float = 0.01) -> str:
    """Around each moment, a line a `slice_s` slice: for each kind of event that ended in it, how many, their
    sizes summed and the longest (ms; a bulk's: its oldest request's wait). Times relative to the moment."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = []
    for moment in moments:
        lines.append(f"== around {moment:.3f}: slice (ms), then per kind: events / their n summed / longest ms")
        first = moment - around_s
        slices: dict[int, dict[str, list[float]]] = {}
        for e in events:
            if first <= e["end"] < moment + around_s:
                cell = slices.setdefault(int((e["end"] - first) / slice_s), {}).setdefault(e["kind"], [0, 0, 0.0])
                cell[0] += 1
                cell[1] += e["n"]
                cell[2] = max(cell[2], (e["end"] - e["start"]) * 1e3)
        for i in range(round(2 * around_s / slice_s)):
            cells = slices.get(i, {})
            text = "  ".join(f"{k} {c[0]}/{c[1]}/{c[2]:.1f}" for k in KINDS if (c := cells.get(k)))
            lines.append(f"  {(first + i * slice_s - moment) * 1e3:+7.0f}  {text}")
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["summary"]:
        print(summary(Path(sys.argv[2])))
        return 0
    if sys.argv[1:2] == ["show"]:
        parser = argparse.ArgumentParser(prog="bench.stage_trace show")
        parser.add_argument("trace", type=Path)
        parser.add_argument("--at", required=True, help="moments, time.monotonic() s, comma-separated")
        parser.add_argument("--around", type=float, default=0.3)
        args = parser.parse_args(sys.argv[2:])
        print(show(args.trace, [float(t) for t in args.at.split(",")], args.around))
        return 0
    install(Path(os.environ["STAGE_TRACE"]))
    from app.cli import main as serve

    return serve(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
