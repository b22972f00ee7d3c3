"""`cudagraph-serve`: the command line. Every setting is a flag, generated from Settings.

    cudagraph-serve serve [--port 8000 --model-repository DIR …]   run the HTTP server
    cudagraph-serve debug-dump --bucket 8 --out graph.dot          one bucket's CUDA graph, as dot
    cudagraph-serve tune --slo-p99-ms 20 [--model NAME --out F]    buckets and max delay for a p99 SLO

Start-up problems (an invalid setting, a bad model.toml or weights file, no CUDA where it was
asked for, a port in use) print one line each and exit non-zero before the server listens.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app import __version__
from app.config import Settings, choices, describe_errors, env_name, flag_name, unknown_variables
from app.tuning.flags import add_tune_flags

log = logging.getLogger("app.cli")


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field: its CGSERVE_ name, default and description in --help."""
    for name, field in Settings.model_fields.items():
        options: dict[str, Any] = {"default": None, "dest": name}
        values = choices(field)
        if field.annotation is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif values:
            options["choices"] = list(values)
        else:
            options["metavar"] = name.upper()
        default = field.get_default(call_default_factory=True)
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        text = f"{field.description or ''} [env {env_name(name)}; default {default}]"
        parser.add_argument(flag_name(name), help=text.replace("%", "%%"), **options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudagraph-serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the HTTP server",
        description="Run the HTTP server. Settings come from flags, then CGSERVE_* variables, then .env.",
    )
    add_settings_flags(serve)
    dump = commands.add_parser("debug-dump", help="capture one bucket's CUDA graph and write it as Graphviz dot")
    dump.add_argument("--model", default=None, help="model of the repository (default: the default model)")
    dump.add_argument("--bucket", type=int, default=8, help="batch size to capture (default 8)")
    dump.add_argument("--out", default="cuda_graph.dot", help="file to write (default cuda_graph.dot)")
    for name in ("model_repository", "device", "dtype"):
        dump.add_argument(f"--{name.replace('_', '-')}", default=None, help=Settings.model_fields[name].description)
    tune = commands.add_parser(
        "tune",
        help="choose buckets and max delay for the highest throughput under a p99 SLO",
        description="Time each bucket's batch and the service's overhead on this machine, choose the buckets and "
        "max delay that sustain the highest rate with p99 within the SLO, and write them as an env file. "
        "The model behind the choice is described in app/tuning/choose.py.",
    )
    add_tune_flags(tune)
    add_settings_flags(tune)
    return parser


def load_settings(overrides: dict[str, Any]) -> Settings:
    """Settings from env and .env with the given flags on top; exits 2 with what to fix."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        sys.stderr.write(describe_errors(error) + "\n")
        raise SystemExit(2) from None


def prepare_or_exit(settings: Settings) -> list[Any]:
    """Every model read, loaded on the CPU and checked, or one line per problem and exit 2."""
    from app.repository import ModelConfigError
    from app.service import prepare_models

    try:
        return prepare_models(settings)
    except ModelConfigError as error:
        sys.stderr.write("cannot start, the model repository has problems:\n")
        sys.stderr.write("".join(f"  {problem}\n" for problem in error.problems))
        raise SystemExit(2) from None
    except (Exception, SystemExit) as error:  # a bug, an environment problem, or a model's code calling exit()
        log.debug("preparing the models failed", exc_info=True)
        sys.stderr.write(f"cannot start: {type(error).__name__}: {' '.join(str(error).split())[:500]}\n")
        raise SystemExit(1) from None


def bind_or_exit(settings: Settings, port: int) -> socket.socket:
    """A socket bound to `port`, before any engine is built: a port in use fails at once."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, port))
    except OSError as error:
        sock.close()
        sys.stderr.write(f"cannot start: cannot listen on {settings.host}:{port}: {error.strerror}\n")
        raise SystemExit(1) from None
    return sock


def serve(settings: Settings, overrides: dict[str, Any]) -> int:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for line in unknown_variables(os.environ):
        log.warning(line)
    prepared = prepare_or_exit(settings)
    sock = bind_or_exit(settings, settings.port)
    if settings.grpc_port:  # checked, then freed for the gRPC server to bind
        bind_or_exit(settings, settings.grpc_port).close()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    scheme = "https" if settings.tls_cert_file else "http"
    mutual = " (clients must present a certificate)" if settings.tls_client_ca_file else ""
    log.info(
        "HTTP on %s://%s:%d (/predict, /v2 of the Open Inference Protocol, /docs)%s",
        *(scheme, host, settings.port, mutual),
    )
    if settings.workers > 1 or settings.engine_process:
        from app.runtime.workers import serve_workers

        sock.close()  # uvicorn's manager binds the port itself, for its workers to share
        return serve_workers(settings, overrides)
    import uvicorn

    from app.http.server import uvicorn_config
    from app.main import create_app

    server: uvicorn.Server | None = None

    def exit_server() -> None:
        """A failed start-up or a dead device: stop now, and for certain within the shutdown timeout."""
        if server is not None:
            server.should_exit = True
        exit_for_certain(settings.shutdown_timeout_s + 5)

    app = create_app(settings, prepared=prepared, on_fatal=exit_server, owns_process=True)
    server = uvicorn.Server(uvicorn_config(app, settings))
    server.run(sockets=[sock])
    return 1 if app.state.service.failure else 0


def exit_for_certain(after_s: float) -> None:
    """A watchdog: a batch hung in the device can hold a graceful shutdown forever."""
    timer = threading.Timer(after_s, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


def debug_dump(args: argparse.Namespace) -> int:
    """Capture one bucket with keep_graphs=True and debug mode on, and write its dot file."""
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("debug-dump captures a CUDA graph and torch sees no CUDA device here\n")
        return 2
    from app.engines.cuda import CudaEngine

    overrides = {"model_repository": args.model_repository, "device": args.device or "cuda", "dtype": args.dtype}
    settings = load_settings({**overrides, "buckets": str(args.bucket), "engine": "cuda-graph"})
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    prepared = {model.spec.name: (model, options) for model, options in prepare_or_exit(settings)}
    name = args.model or settings.default_model or next(iter(prepared))
    if name not in prepared:
        sys.stderr.write(f"no model named {name!r}; the repository has {list(prepared)}\n")
        return 2
    model, options = prepared[name]
    torch.cuda.CUDAGraph().enable_debug_mode()  # must precede the capture to record the graph
    engine = CudaEngine(
        model.module,
        model.spec,
        (args.bucket,),
        device=torch.device(options.devices[0]),
        dtype=options.dtype,
        channels_last=options.channels_last,
        in_flight=1,
        host_io=settings.host_io,
        keep_graphs=True,
    )
    engine.debug_dump(args.bucket, args.out)
    engine.close()
    sys.stdout.write(f"wrote the CUDA graph of {name}, bucket {args.bucket}, to {Path(args.out)}\n")
    return 0


def run_tune(args: argparse.Namespace) -> int:
    """Settings as `serve` reads them (flags over env over .env), the models checked, then the tuner."""
    from app.tuning.command import tune

    overrides = {name: getattr(args, name) for name in Settings.model_fields}
    settings = load_settings(overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per overhead request
    return tune(args, settings, overrides, prepare_or_exit(settings))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        overrides = {name: value for name, value in vars(args).items() if name != "command"}
        return serve(load_settings(overrides), overrides)
    if args.command == "debug-dump":
        return debug_dump(args)
    if args.command == "tune":
        return run_tune(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
