"""The tuner's own flags (the settings' flags are added beside them); imports nothing heavy, so
`cudagraph-serve --help` stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_tune_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--slo-p99-ms", type=float, required=True, help="the p99 latency bound, end to end, in milliseconds")
    add("--model", default=None, help="model of the repository to tune (default: the default or only model)")
    out = "env file to write the chosen settings into, other lines kept (default .env: the file serve and compose read)"
    add("--out", type=Path, default=Path(".env"), help=out)
    add("--json", type=Path, default=None, help="also write every measurement and prediction to this JSON file")
    add("--max-bucket", type=int, default=256, help="largest candidate bucket (default 256; lower it to save memory)")
    add("--runs", type=int, default=100, help="timed batches per bucket (default 100)")
    add("--input-dtype", choices=("uint8", "float32"), default="uint8", help="staging dtype timed (default uint8)")
    add("--overhead-ms", type=float, default=None, help="per-request overhead to assume instead of measuring it")
    add("--overhead-requests", type=int, default=200, help="lone requests the overhead is measured on (default 200)")
    warmup = "seconds of lone requests before those measured: a fresh server's first seconds are slow (default 10)"
    add("--overhead-warmup-s", type=float, default=10.0, help=warmup)
    add("--startup-timeout", type=float, default=600.0, help="seconds the overhead server may take to get ready")
