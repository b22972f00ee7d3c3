"""`cudagraph-serve`: the command line. `serve` starts the HTTP server; flags override settings."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from typing import Any

import uvicorn
from pydantic import ValidationError

from app.config import Settings, describe_errors

# Flags that map one-to-one onto Settings fields (dashes for underscores).
SERVE_FLAGS: dict[str, dict[str, Any]] = {
    "host": {},
    "port": {"type": int},
    "device": {"help": "auto | cpu | cuda | cuda:N"},
    "engine": {"choices": ["auto", "eager", "cuda-graph"]},
    "model": {"choices": ["fashion-cnn"]},
    "weights": {},
    "buckets": {"help": "comma-separated batch sizes, e.g. 1,2,4,8"},
    "max-delay-ms": {"type": float},
    "queue-limit": {"type": int},
    "in-flight": {"type": int},
    "request-timeout-s": {"type": float},
    "max-body-bytes": {"type": int},
    "max-instances": {"type": int},
    "max-image-pixels": {"type": int},
    "dtype": {"choices": ["fp32", "fp16", "bf16"]},
    "channels-last": {"action": argparse.BooleanOptionalAction},
    "event-wait": {"choices": ["poll", "spin", "block"]},
    "workers": {"type": int},
    "log-level": {"choices": ["debug", "info", "warning", "error"]},
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudagraph-serve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server (settings: CGSERVE_* env, .env, flags)")
    for flag, options in SERVE_FLAGS.items():
        serve.add_argument(f"--{flag}", default=None, **options)
    dump = commands.add_parser("debug-dump", help="capture one bucket's CUDA graph and write its debug dump (dot)")
    dump.add_argument("--bucket", type=int, default=8, help="batch size to capture (default 8)")
    dump.add_argument("--out", default="cuda_graph.dot", help="file to write (default cuda_graph.dot)")
    dump.add_argument("--device", default="cuda")
    dump.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default=None)
    return parser


def load_settings(overrides: dict[str, Any]) -> Settings:
    """Settings from env and .env with the given flags on top; exits 2 with what to fix."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        sys.stderr.write(describe_errors(error) + "\n")
        raise SystemExit(2) from None


def serve(settings: Settings, overrides: dict[str, Any]) -> int:
    if settings.workers > 1:
        return serve_workers(settings, overrides)
    from app.main import create_app

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server: uvicorn.Server | None = None

    def exit_server() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_fatal=exit_server)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # per-request logging costs more than the model; metrics count requests
        loop="auto",  # uvloop where installed
        http="auto",  # httptools where installed
    )
    server = uvicorn.Server(config)
    server.run()
    return 1 if app.state.service.failure else 0


def serve_workers(settings: Settings, overrides: dict[str, Any]) -> int:
    """uvicorn's process manager: `workers` processes share the port, each builds its own engine.

    The flags reach the workers as CGSERVE_* variables (they re-read Settings); Prometheus runs
    in multiprocess mode so that /metrics in any worker reports all of them. The parent must
    not import prometheus_client before PROMETHEUS_MULTIPROC_DIR is set, so app.main is
    imported only by the workers. A worker whose start-up fails leaves a marker and stops the
    manager, so the whole server exits 1, as a single process does.
    """
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"CGSERVE_{name.upper()}"] = _env_value(value)
    with tempfile.TemporaryDirectory(prefix="cgserve-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        os.environ[_FAILED_MARKER_ENV] = os.path.join(metrics_dir, "start-up-failed")
        uvicorn.run(
            "app.cli:worker_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level,
            access_log=False,
            loop="auto",
            http="auto",
        )
        return 1 if os.path.exists(os.environ[_FAILED_MARKER_ENV]) else 0


_FAILED_MARKER_ENV = "CGSERVE_START_UP_FAILED_MARKER"


def worker_app() -> Any:
    """The app of one worker under serve_workers (uvicorn calls this factory in each process)."""
    from app.main import create_app

    def stop_every_worker() -> None:
        with open(os.environ[_FAILED_MARKER_ENV], "w"):
            pass
        os.kill(os.getppid(), signal.SIGTERM)  # the manager stops all workers and returns

    return create_app(on_fatal=stop_every_worker)


def _env_value(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def debug_dump(bucket: int, out: str, overrides: dict[str, Any]) -> int:
    """Capture `bucket` alone with keep_graph=True and debug mode on, and write its dot file."""
    import torch

    from app.engines import resolve_device
    from app.engines.cuda import CudaEngine
    from app.model_spec import SPECS

    settings = load_settings({**overrides, "buckets": (bucket,), "engine": "cuda-graph"})
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    spec = SPECS[settings.model]
    torch.cuda.CUDAGraph().enable_debug_mode()  # must precede the capture to record the graph
    engine = CudaEngine(
        spec.build(settings.weights),
        spec,
        settings.buckets,
        device=torch.device(resolve_device(settings.device)),
        dtype=settings.dtype,
        slots=1,
        keep_graphs=True,
    )
    engine.debug_dump(bucket, out)
    engine.close()
    sys.stdout.write(f"wrote the CUDA graph of bucket {bucket} to {out}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        overrides = {name: value for name, value in vars(args).items() if name != "command"}
        return serve(load_settings(overrides), overrides)
    if args.command == "debug-dump":
        return debug_dump(args.bucket, args.out, {"device": args.device, "dtype": args.dtype})
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
