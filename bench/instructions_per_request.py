"""Instructions per request of the service's ASGI app, counted by valgrind: a figure that holds still.

    PYTHONPATH=. python3 bench/instructions_per_request.py [--apps ours,no-op] [--forms json,raw]
        [--requests 1000] [--concurrency 50] [--without metrics,deadline,guard,batch-metrics,batcher]

The development machine's wall-clock and CPU-time rates swing by ±30 % between rounds (steal
time on a 2-core VM), more than most changes to the request path are worth. Instructions do not:
two runs of one tree agree within 0.3 %. Each (app, form) runs in a process of its own under
callgrind with instrumentation off; after start-up and a warm-up of as many requests, the
process tells this driver, which switches instrumentation on (callgrind_control) for exactly
--requests requests at --concurrency, and off again. The apps: ours (the real app, routes,
guards, batcher and metrics, with bench/proxy_server.py's stand-in engine) and the plain-route
no-op; the request: loadtest/in_process.py's one image, JSON or raw. Instructions are not time
(a suspended request costs the event loop system calls and cache misses this does not count), so
compare trees with it, and servers over HTTP on the GPU machine. About a minute per (app, form);
needs valgrind (Debian: valgrind).

--without runs ours again with one part of the request path taken out, for what each costs:
metrics (the per-request counter and latency histogram), deadline (the handler's end-to-end
deadline, app/dataplane.py's within), guard (the RequestGuard middleware), batch-metrics (every metric the
batcher keeps, per request and per batch) or batcher (submit answers at once: no queue, future,
wait, batch, staging or launch). --concurrency 1 makes every request a batch of its own: the
per-batch costs in full. Measurement only: the service
never runs without them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure(app: str, form: str, requests: int, concurrency: int, without: str = "") -> int:
    """Instructions for `requests` requests, run under callgrind with the window toggled from here."""
    with tempfile.TemporaryDirectory(prefix="ir-") as folder:
        marks = Path(folder)
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={marks}/cg.out", "-q"]
        argv += [sys.executable, __file__, "--serve", app, form, str(requests), str(concurrency), folder, without]
        log = (marks / "log").open("wb")
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

        def wait_for(name: str) -> None:
            while not (marks / name).exists():
                if process.poll() is not None:
                    tail = (marks / "log").read_text()[-2000:]
                    raise RuntimeError(f"{app} {form} exited {process.returncode}: {tail}")
                time.sleep(0.1)

        wait_for("ready")
        subprocess.run(["callgrind_control", "-i", "on", str(process.pid)], check=True, capture_output=True)
        (marks / "go").touch()
        wait_for("done")
        subprocess.run(["callgrind_control", "-i", "off", str(process.pid)], check=True, capture_output=True)
        (marks / "stop").touch()
        process.wait(timeout=120)
        totals = [line.split()[1] for out in marks.glob("cg.out*") for line in out.read_text().splitlines()
                  if line.startswith("totals:")]  # fmt: skip
        return sum(int(total) for total in totals)


def wait_for_file(path: Path) -> None:
    """The driver's cue (it runs callgrind_control between the marks), polled off the event loop."""
    while not path.exists():
        time.sleep(0.05)


def take_out(app: Any, part: str) -> None:
    """Remove one part of ours' request path (see --without)."""
    import contextlib

    import app.dataplane as dataplane

    if part == "metrics":  # the per-request counter and latency histogram, and the refusals' counter
        dataplane.metrics = SimpleNamespace(  # type: ignore[assignment]
            observe_request=lambda *args: None, reject=lambda *args: None
        )
    elif part == "deadline":
        dataplane.within = lambda deadline: contextlib.nullcontext()  # type: ignore[assignment,misc]
    elif part == "guard":
        app.user_middleware = [m for m in app.user_middleware if m.cls.__name__ != "RequestGuard"]
    elif part == "batch-metrics":  # every metric the batcher keeps, per request and per batch
        from app.batching import batcher

        def nothing(*args: Any) -> None:
            pass

        null = SimpleNamespace(inc=nothing, dec=nothing, set=nothing, observe=nothing)
        family = SimpleNamespace(labels=lambda **labels: null)
        batcher.metrics = SimpleNamespace(  # type: ignore[assignment]
            BATCHES=family, PADDING_ROWS=family, BATCH_COMPUTE=family, QUEUE_DEPTH=family, QUEUE_WAIT=family,
            BATCH_ROWS=family, IN_FLIGHT=family, device_children=lambda model, device: (null, null, null),
        )  # fmt: skip
    elif part == "batcher":  # the answer at once: no queue, future, wait, batch, staging or launch
        import numpy as np

        from app.batching.batcher import Batcher

        async def answer_now(self: Batcher, images: Any, deadline: float | None = None) -> Any:
            return np.full((len(images), self._num_classes), 0.1, np.float32)

        Batcher.submit = answer_now  # type: ignore[method-assign]
    else:
        raise ValueError(f"--without takes metrics, deadline, guard, batch-metrics or batcher; got {part!r}")


def serve(app_name: str, form: str, requests: int, concurrency: int, folder: str, without: str) -> None:
    """In the process under valgrind: start the app, warm up, then the counted requests on cue."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import uvloop
    from proxy_server import TimerEngine

    from app import service as service_module
    from app.config import Settings
    from app.main import create_app
    from loadtest.in_process import JSON_BODY, MEDIA, RAW_BODY, post, post_scope, started
    from loadtest.servers.noop import lean_app

    body = RAW_BODY if form == "raw" else JSON_BODY
    scope = post_scope(body, MEDIA[form])
    marks = Path(folder)

    async def drive(app: Any) -> None:
        """`requests` requests, `concurrency` at a time."""

        async def loop() -> None:
            for _ in range(requests // concurrency):
                if await post(app, scope, body) != 200:
                    raise RuntimeError("a request failed")

        await asyncio.gather(*(loop() for _ in range(concurrency)))

    async def main() -> None:
        service_module.build_engine = lambda model, options, *, in_flight, **_: TimerEngine(  # type: ignore[assignment]
            80e-6, options.buckets, in_flight
        )
        app: Any = create_app(Settings(grpc_port=0, log_level="warning")) if app_name == "ours" else lean_app  # type: ignore[call-arg]
        if without:
            take_out(app, without)
        lifespan = await started(app)
        if app_name == "ours":
            await app.state.service.wait_started()
        await drive(app)  # warm: first-use caches and imports
        (marks / "ready").touch()
        await asyncio.to_thread(wait_for_file, marks / "go")
        await drive(app)
        (marks / "done").touch()
        await asyncio.to_thread(wait_for_file, marks / "stop")
        lifespan.cancel()

    uvloop.run(main())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        app, form, requests, concurrency, folder, without = sys.argv[2:8]
        serve(app, form, int(requests), int(concurrency), folder, without)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--apps", default="ours,no-op")
    p.add_argument("--forms", default="json,raw")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--without", default="", help="also ours without each part named (see above)")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        p.error("valgrind is not installed (Debian: apt-get install valgrind)")
    counted = args.requests // args.concurrency * args.concurrency
    for form in args.forms.split(","):
        figures = {app: measure(app, form, counted, args.concurrency) / counted for app in args.apps.split(",")}
        for app, per_request in figures.items():
            print(f"{app:6s} {form:4s} {per_request:10,.0f} instructions a request ({counted} requests)", flush=True)
        if {"ours", "no-op"} <= figures.keys():
            extra = figures["ours"] - figures["no-op"]
            print(f"{form}: ours ÷ no-op {figures['no-op'] / figures['ours']:.3f}; the service's extra {extra:,.0f}")
        for part in filter(None, args.without.split(",")):
            without = measure("ours", form, counted, args.concurrency, part) / counted
            saved = figures["ours"] - without if "ours" in figures else float("nan")
            line = f"ours   {form:4s} {without:10,.0f} instructions a request without {part} ({saved:,.0f} less)"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
