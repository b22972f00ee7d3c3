"""`cudagraph-serve tune --slo-p99-ms X`: measure, choose, write the settings, say what and why.

1. build the model's engine as the service would, with every candidate bucket up to --max-bucket
2. time each bucket's batch (measure.py), then close the engine
3. time the service's per-request overhead on the real server (overhead.py), or take --overhead-ms
4. choose buckets and max delay for the highest capacity under the SLO (choose.py)
5. write the chosen settings into the env file (--out, default .env, other lines kept), print the
   model.toml lines, and the JSON report (--json) if asked
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.access.tokens import load_tokens
from app.config import Settings
from app.engines.factory import EngineOptions, use_compile_cache
from app.repository import LoadedModel
from app.tuning.choose import Choice, InfeasibleSloError, Timing, capacity, choose
from app.tuning.measure import build_candidate_engine, candidate_buckets, measure_replays
from app.tuning.overhead import measure_overhead, server_settings
from app.tuning.settings_file import TUNED, choice_json, timing_ms, toml_lines, write_env_file, write_report


def tune(
    args: argparse.Namespace,
    settings: Settings,
    overrides: dict[str, Any],
    prepared: list[tuple[LoadedModel, EngineOptions]],
) -> int:
    """The subcommand; its exit status (2: a bad flag, 1: the engine or the server failed, 3: SLO out of reach)."""
    models = {model.spec.name: (model, options) for model, options in prepared}
    name = args.model or settings.default_model or (next(iter(models)) if len(models) == 1 else None)
    if name is None or name not in models:
        sys.stderr.write(f"name the model to tune with --model; the repository has {sorted(models)}\n")
        return 2
    problems = [f"--{flag} must be {rule}; got {value:g}" for flag, value, rule, ok in (
        ("slo-p99-ms", args.slo_p99_ms, "positive", args.slo_p99_ms > 0),
        ("max-bucket", args.max_bucket, "at least 1", args.max_bucket >= 1),
        ("runs", args.runs, "at least 1", args.runs >= 1),
        ("overhead-requests", args.overhead_requests, "at least 1", args.overhead_requests >= 1),
        ("overhead-ms", args.overhead_ms or 0, "0 or more", (args.overhead_ms or 0) >= 0),
    ) if not ok]  # fmt: skip
    if problems:
        sys.stderr.write("".join(f"{problem}\n" for problem in problems))
        return 2
    model, options = models[name]
    use_compile_cache(settings)
    buckets = candidate_buckets(args.max_bucket)
    say(f"{name}: {options.engine} on {options.devices[0]} ({options.dtype}), timing buckets {list(buckets)}")
    try:
        engine = build_candidate_engine(
            model, options, buckets, in_flight=settings.in_flight, event_wait=settings.event_wait,
            host_io=settings.host_io,
        )  # fmt: skip
    except Exception as error:  # out of memory at the largest bucket, most likely: one line, what to change
        sys.stderr.write(f"cannot build {name}'s engine with buckets up to {buckets[-1]} ({type(error).__name__}: ")
        sys.stderr.write(f"{' '.join(str(error).split())[:300]}); a lower --max-bucket needs less memory\n")
        return 1
    try:
        replay = measure_replays(engine, dtype=args.input_dtype, runs=args.runs)
    finally:
        engine.close()
    for bucket, timing in replay.items():
        say(f"  bucket {bucket:>4}: median {timing.median_s * 1e3:8.3f} ms  p99 {timing.p99_s * 1e3:8.3f} ms")
    smallest = min(replay)
    if args.overhead_ms is not None:
        overhead = Timing(args.overhead_ms / 1e3, args.overhead_ms / 1e3)
        source = "given (--overhead-ms)"
    else:
        say(f"overhead: {args.overhead_requests} lone requests to the real server (bucket {smallest}, max delay 0)")
        passed = {k: v for k, v in overrides.items() if k not in ("buckets", "max_delay_ms", "host", "port")}
        try:
            overhead, subtracted = measure_overhead(
                model=name,
                input_shape=model.spec.input_shape,
                bucket=smallest,
                replay_median_s=replay[smallest].median_s,
                settings_env=server_settings(passed),
                requests=args.overhead_requests,
                warmup_s=args.overhead_warmup_s,
                startup_timeout_s=args.startup_timeout,
                # The server reads the same settings and .env: where they set tokens, its routes want one.
                token=next(iter(load_tokens(settings.auth_tokens, settings.auth_tokens_file)), None),
                admin_token=next(iter(load_tokens(settings.admin_tokens, settings.admin_tokens_file)), None),
            )
        except (RuntimeError, TimeoutError) as error:  # the server's log tail is in the message
            sys.stderr.write(f"the overhead server failed (give --overhead-ms to skip it): {error}\n")
            return 1
        source = f"measured: the real server at low load, latency less {subtracted}"
    say(f"overhead: median {overhead.median_s * 1e3:.3f} ms  p99 {overhead.p99_s * 1e3:.3f} ms ({source})")
    try:
        chosen = choose(replay, overhead, args.slo_p99_ms)
    except InfeasibleSloError as error:
        sys.stderr.write(f"{error}\n")
        return 3
    default_buckets = tuple(b for b in options.buckets if b in replay)
    default = None
    if default_buckets == options.buckets:  # the model of the defaults, where all their buckets were timed
        default = capacity(replay, default_buckets, options.max_delay_ms / 1e3, overhead, args.slo_p99_ms / 1e3)
    write_env_file(args.out, chosen, model=name, slo_ms=args.slo_p99_ms)
    say(
        f"chose buckets {list(chosen.buckets)}, max delay {chosen.max_delay_ms:g} ms: predicted "
        f"{chosen.capacity_rps:,.0f} req/s with p99 ≤ {chosen.worst_p99_ms:.2f} ms (SLO {args.slo_p99_ms:g} ms); "
        "the device's limit: where the host's HTTP path saturates first, less"
    )
    if default is not None:
        say(
            f"the current settings (buckets {list(default_buckets)}, max delay {options.max_delay_ms:g} ms): "
            f"predicted {default.capacity_rps:,.0f} req/s with p99 ≤ {default.worst_p99_ms:.2f} ms"
        )
    say(f"wrote {args.out}; in {name}'s model.toml instead: " + "; ".join(toml_lines(chosen)))
    if args.out.resolve() != Path(".env").resolve():
        say(f"note: the service reads .env, not {args.out}: copy its lines there (or give --out .env)")
    shadowing = [variable for variable in TUNED if variable in os.environ]
    if shadowing:
        say(f"note: {', '.join(shadowing)} set in the environment win over {args.out}: unset them to serve these")
    if options.buckets != settings.buckets or options.max_delay_ms != settings.max_delay_ms:
        say(f"note: {name}'s model.toml sets its own buckets or max delay, which win over the env file")
    if args.json:
        write_report(args.json, report(args, name, options, replay, overhead, source, chosen, default))
    return 0


def report(
    args: argparse.Namespace,
    name: str,
    options: EngineOptions,
    replay: dict[int, Timing],
    overhead: Timing,
    source: str,
    chosen: Choice,
    default: Choice | None,
) -> dict[str, Any]:
    return {
        "schema": "cgserve-tune/1",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["cudagraph-serve", *sys.argv[1:]]),
        "model": name,
        "engine": {"engine": options.engine, "device": options.devices[0], "dtype": options.dtype},
        "slo_p99_ms": args.slo_p99_ms,
        "input_dtype": args.input_dtype,
        "runs_per_bucket": args.runs,
        "replay": {str(b): timing_ms(t) for b, t in replay.items()},
        "overhead": timing_ms(overhead) | {"source": source},
        "chosen": choice_json(chosen),
        "current_settings": {"buckets": list(options.buckets), "max_delay_ms": options.max_delay_ms},
        "current_settings_predicted": choice_json(default),
    }


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
