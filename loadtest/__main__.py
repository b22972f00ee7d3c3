"""Load generator for cudagraph-serve (HTTP/1.1, httpx, gRPC, several processes).

    python -m loadtest --url http://127.0.0.1:8000 --rate 500 --duration 10 --out run.json
    python -m loadtest --url http://127.0.0.1:8000 --concurrency 32 --processes 4 --form raw
    python -m loadtest --url http://127.0.0.1:8000 --concurrency 32 --form v2      # Open Inference Protocol
    python -m loadtest --url grpc://127.0.0.1:8001 --concurrency 32 --form v2 --client grpc-stream
    python -m loadtest sweep --url http://127.0.0.1:8000 --rates 100,200,400,800 --slo-p99-ms 5 \\
        --out sweep.json --plot sweep.png

--rate: open loop, Poisson arrivals; latency counted from each request's scheduled send time.
--concurrency: closed loop, that many requests in flight.
Every answer is checked: HTTP status, shape, and each label against the eager CPU model.
Only http:// (grpc:// for the gRPC clients) URLs on 127.0.0.1, localhost or ::1 are accepted;
every run ends by itself.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import orjson

from loadtest.payloads import DEFAULT_MIN_MARGIN, FORMS, RAW_DTYPES, PayloadOptions
from loadtest.runner import run_load
from loadtest.spec import CLIENTS, GRPC_CLIENTS, LoadSpec
from loadtest.sweep import plot_path, plot_sweep, run_sweep, sweep_summary


def _common(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", default="http://127.0.0.1:8000", help="server base URL, local only; grpc://host:port for the gRPC "
        "clients (default %(default)s)")  # fmt: skip
    add("--path", default="/predict", help="request path; the v2 form names its model by it, over gRPC too "
        "(default %(default)s; the v2 form's: /v2/models/fashion-cnn/infer)")  # fmt: skip
    add("--form", choices=FORMS, default="json", help="request body form (default %(default)s)")
    add("--batch", type=int, default=1, help="images per request, json, raw and v2 forms (default 1)")
    add("--raw-dtype", choices=RAW_DTYPES, default="uint8", help="raw form's element type (default uint8)")
    add("--processes", type=int, default=1, help="load-generator processes, each with rate/N (default 1)")
    add("--connections", type=int, help="total connection limit (default: concurrency, or 64 per process)")
    add("--warmup", type=float, default=2.0, help="seconds left out of the figures (default %(default)s)")
    add(
        "--duration",
        type=float,
        default=10.0,
        help="measured seconds after the warm-up (default %(default)s)",
    )
    add("--timeout", type=float, default=10.0, help="per-request timeout, s (default %(default)s)")
    add(
        "--client",
        choices=CLIENTS,
        default="lean",
        help="lean: a bare HTTP/1.1 client, 4-8x less CPU a request; httpx: the full client, to check it; "
        "grpc, grpc-stream: the v2 form over gRPC, a ModelInfer call a request or ModelStreamInfer streams "
        "(default %(default)s)",
    )
    add("--seed", type=int, default=0, help="seed of the Poisson schedule (default 0)")
    add("--weights", help="weights for the reference labels (default models/repository/fashion-cnn/fashion_cnn.pt)")
    add("--no-check-labels", action="store_true", help="check status and shape only (e.g. a no-op server)")
    add(
        "--min-margin",
        type=float,
        default=DEFAULT_MIN_MARGIN,
        help="leave out images whose top-2 logit gap is below this (default %(default)s)",
    )
    add("--images", type=int, help="use only the first N of the 1000 shipped images")
    add(
        "--image-shape",
        type=lambda text: tuple(int(v) for v in text.split(",")),
        help="C,H,W of another model (e.g. 3,224,224 with --path /v1/models/resnet50/predict): random raw pixels",
    )
    add("--out", type=Path, help="write the JSON record here")
    add("--quiet", action="store_true", help="no progress line on stderr")


def _options(args: argparse.Namespace) -> PayloadOptions:
    return PayloadOptions(
        form=args.form,
        batch=args.batch,
        raw_dtype=args.raw_dtype,
        check_labels=not args.no_check_labels,
        weights=args.weights,
        min_margin=args.min_margin,
        images=args.images,
        path=args.path,
        image_shape=args.image_shape,
    )


def _spec(args: argparse.Namespace, *, rate: float | None, concurrency: int | None) -> LoadSpec:
    return LoadSpec(
        url=args.url,
        rate=rate,
        concurrency=concurrency,
        processes=args.processes,
        connections=args.connections,
        warmup_s=args.warmup,
        duration_s=args.duration,
        timeout_s=args.timeout,
        seed=args.seed,
        client=args.client,
    )


def _write(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n")
        print(f"wrote {path}")


def _parse_rates(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates takes comma-separated numbers, got {text!r}") from None


def build_parser(*, sweep: bool = False) -> argparse.ArgumentParser:
    """The parser of `python -m loadtest` (one run) or of `python -m loadtest sweep`."""
    if sweep:
        parser = argparse.ArgumentParser(
            prog="python -m loadtest sweep",
            description="Raise an open-loop rate step by step; quote the highest rate within a p99 SLO.",
        )
        _common(parser)
        add = parser.add_argument
        add("--rates", type=_parse_rates, required=True, help="increasing rates, req/s, e.g. 100,200,400")
        add("--slo-p99-ms", type=float, required=True, help="p99 latency objective, ms")
        add("--max-failures", type=int, default=1, help="stop after this many failing steps in a row (default 1)")
        add("--plot", type=Path, help="latency-vs-throughput PNG (default: --out with .png)")
        return parser
    parser = argparse.ArgumentParser(
        prog="python -m loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _common(parser)
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this total rate, req/s")
    load.add_argument("--concurrency", type=int, help="closed loop: this many requests in flight")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "loadtest", *argv])
    sweep = argv[:1] == ["sweep"]
    parser = build_parser(sweep=sweep)
    args = parser.parse_args(argv[1:] if argv[:1] in (["sweep"], ["run"]) else argv)
    options = _options(args)
    if args.client in GRPC_CLIENTS and args.form != "v2":
        parser.error(f"--client {args.client} sends the v2 form: add --form v2")
    try:
        if sweep:
            return _sweep(args, options, command)
        spec = _spec(args, rate=args.rate, concurrency=args.concurrency)
        spec.validate()
        record = run_load(spec, options.build(), command=command, progress=not args.quiet)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    _write(args.out, record)
    print(record["summary"])
    return 0


def _sweep(args: argparse.Namespace, options: PayloadOptions, command: str) -> int:
    base = _spec(args, rate=args.rates[0] if args.rates else 1.0, concurrency=None)
    base.validate()
    sweep = run_sweep(
        base,
        options.build(),
        options,
        rates=args.rates,
        slo_p99_ms=args.slo_p99_ms,
        max_failures=args.max_failures,
        command=command,
        progress=not args.quiet,
    )
    plot = plot_path(args.plot, args.out)
    if plot is not None:
        try:
            plot_sweep(sweep, plot)
        except ModuleNotFoundError as missing:  # --plot without matplotlib: the steps are kept all the same
            _write(args.out, sweep)
            print(f"{plot} not drawn: {missing.name} is not installed (.venv/bin/pip install -e '.[loadtest]')",
                  file=sys.stderr)  # fmt: skip
            return 1
        sweep["plot"] = str(plot)
        print(f"wrote {plot}")
    _write(args.out, sweep)
    print(sweep_summary(sweep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
