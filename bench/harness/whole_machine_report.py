"""The whole-machine benchmark's verdicts (issue 12's targets) and markdown, from its JSON report
(bench/whole_machine.py writes it)."""

from __future__ import annotations

import itertools
from typing import Any

from bench.harness.report import num

RATIO_TARGET = 0.8  # ours ≥ 0.8 × the no-op ceiling of the same worker count (issue 12: a routed no-op)
RAW_RATIO_TARGET = 0.7  # … ≥ 0.7 × a raw ASGI no-op, the server's own limit (issue 26, item 5)
MODERATE_IN_FLIGHT, MODERATE_TARGET = 8, 0.8  # 8 in flight a worker: ours ≥ 0.8 × the no-op there (issue 26, item 4)
P99_TARGET_MS = 5.0  # one worker's p99 at half of its saturation
BUSY_TARGET = 0.7  # the generator's CPU share at the no-op's saturation
HEY_TOLERANCE = 0.10  # our generator within 10 % of hey at the same point


def _form(report: dict[str, Any], server: str, form: str) -> dict[str, Any] | None:
    result: dict[str, Any] | None = report["servers"].get(server, {}).get("forms", {}).get(form)
    return result


def _sat(report: dict[str, Any], server: str, form: str) -> float | None:
    f = _form(report, server, form)
    return f["saturation"]["throughput_rps"] if f else None


def _at(report: dict[str, Any], server: str, form: str, concurrency: int) -> float | None:
    """The closed-loop step's req/s at this many in flight (None where it erred or was not run)."""
    f = _form(report, server, form)
    steps = (f or {}).get("closed_loop", [])
    good = [c for c in steps if c["concurrency"] == concurrency and not c["counts"]["errors"]]
    return good[0]["throughput_rps"] if good else None


# design → its servers' name prefix
DESIGNS = {
    "per-process": "ours",
    "engine-process": "ours-ep",
    "asgi": "ours-asgi",
    "spin": "ours-spin",
    "block": "ours-block",
}


def _designs(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(design, server prefix) of each of our designs the run served (per-process engines before this flag)."""
    return [(d, DESIGNS[d]) for d in report["settings"].get("designs", ["per-process"])]


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue that this run measured: what, the value, the target, met or not."""
    s, out = report["settings"], []
    # Records before run 22 name a routed no-op (no "raw ASGI" in their ceiling).
    target = RAW_RATIO_TARGET if "raw ASGI" in s.get("ceiling", "") else RATIO_TARGET

    def check(what: str, value: float | None, target: str, met: bool | None) -> None:
        out.append({"what": what, "value": value, "target": target, "met": met})

    for n in s["workers"]:
        for form, (design, prefix) in itertools.product(s["forms"], _designs(report)):
            ours, noop = _sat(report, f"{prefix}-{n}", form), _sat(report, f"noop-{n}", form)
            ratio = round(ours / noop, 3) if ours and noop else None
            check(
                f"{n} worker(s), {form}: ours ÷ no-op" + (f" ({design})" if prefix != "ours" else ""),
                ratio,
                f"≥ {target}",
                None if ratio is None else ratio >= target,
            )
            # One worker at 8 in flight is the 1-worker ladder's first step, not item 4's spread over workers.
            if n > 1 and MODERATE_IN_FLIGHT in s["concurrency_per_worker"]:
                c = n * MODERATE_IN_FLIGHT
                ours, noop = _at(report, f"{prefix}-{n}", form, c), _at(report, f"noop-{n}", form, c)
                ratio = round(ours / noop, 3) if ours and noop else None
                named = f" ({design})" if prefix != "ours" else ""
                check(
                    f"{n} worker(s), {form}, {c} connections: ours ÷ no-op{named}",
                    ratio,
                    f"≥ {MODERATE_TARGET}",
                    None if ratio is None else ratio >= MODERATE_TARGET,
                )
    one = min(s["workers"])
    for form in s["forms"]:
        f = _form(report, f"ours-{one}", form)
        p99 = f["half_saturation"]["latency_ms"]["p99"] if f and "half_saturation" in f else None
        check(
            f"ours-{one} {form}: p99 at half saturation (ms)",
            p99,
            f"≤ {P99_TARGET_MS:g}",
            None if p99 is None else p99 <= P99_TARGET_MS,
        )
    top = max(s["workers"])
    for form in s["forms"]:
        f = _form(report, f"noop-{top}", form)
        busy = f["saturation"]["loadgen_cpu_busy"] if f else None
        check(
            f"noop-{top} {form}: generator busy at saturation",
            busy,
            f"< {BUSY_TARGET}",
            None if busy is None else busy < BUSY_TARGET,
        )
        hey = f.get("hey") if f else None
        ratio = hey.get("loadtest_over_hey") if hey else None
        met = None if ratio is None else abs(ratio - 1) <= HEY_TOLERANCE
        check(f"noop-{top} {form}: this generator ÷ hey", ratio, f"1 ± {HEY_TOLERANCE:g}", met)
    return out


def _server_side_row(name: str, form: str, v: dict[str, Any]) -> str:
    def get(family: str, key: str, fmt: str = ".2f") -> str:
        return num(v.get(family, {}).get(key), fmt)

    # The HTTP workers' loops (records before the engine process sampled its own have the whole only).
    lag = "loop_lag_ms_worker" if "loop_lag_ms_worker" in v else "loop_lag_ms"

    return (
        f"| {name} | {form} | {get('handler_ms', 'p50')} | {get('handler_ms', 'p99')} | "
        f"{get('queue_wait_ms', 'p99')} | {get(lag, 'p99')} ({get(lag, 'count', ',.0f')}) | "
        f"{get('gc_pause_ms', 'count', ',.0f')} ({get('gc_pause_ms', 'mean')}) | {get('batch_rows', 'mean', '.1f')} |"
    )


def _busy(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def markdown(report: dict[str, Any]) -> str:
    m, s, pin = report["machine"], report["settings"], report["pinning"]
    servers = report["servers"]
    lines = [
        f"# Whole machine, seed CNN — {report['started_at'][:10]}",
        "",
        f"{m['gpu'] or 'no GPU'} · {m['cpu_model'] or 'CPU'} ({m['cpu_count']} cores) · torch {m['torch']} · "
        f"servers on cores {pin['server_cores'] or 'unpinned'}, generator on {pin['loadgen_cores'] or 'unpinned'} "
        f"({s['processes']} {s['client']}-driver processes) · ours: {s['ours']} · ceiling: {s['ceiling']} · "
        f"each step {s['duration_s']:g} s after {s['warmup_s']:g} s warm-up · {report['wall_s']:.0f} s in all.",
        "",
        "Saturation: the best error-free closed-loop step over "
        + "/".join(str(c) for c in s["concurrency_per_worker"])
        + " in flight per worker. Busy: the generator's mean CPU share per process at that step.",
        "",
        "| workers | form | no-op req/s (c, busy) | ours req/s (c, busy) | ours ÷ no-op |",
        "|---:|---|---:|---:|---:|",
    ]

    def cell(server: str, form: str) -> str:
        f = _form(report, server, form)
        if f is None:
            return str(servers.get(server, {}).get("error", "–"))
        sat = f["saturation"]
        return f"{num(sat['throughput_rps'])} (c{sat['concurrency']}, {_busy(sat['loadgen_cpu_busy'])})"

    for n in sorted(s["workers"]):
        for form, (design, prefix) in itertools.product(s["forms"], _designs(report)):
            ours, noop = _sat(report, f"{prefix}-{n}", form), _sat(report, f"noop-{n}", form)
            ratio = num(ours / noop, ".2f") if ours and noop else "–"
            workers = f"{n} ({design})" if prefix != "ours" else str(n)
            lines.append(
                f"| {workers} | {form} | {cell(f'noop-{n}', form)} | {cell(f'{prefix}-{n}', form)} | {ratio} |"
            )
    lines += [
        "",
        "Open loop (Poisson) at half of each server's own saturation, latency from the scheduled send; "
        "p99 is the median step's of the steps listed:",
        "",
    ]
    lines += ["| server | form | rate req/s | p50 ms | p99 ms | each step's p99 ms | busy |"]
    lines += ["|---|---|---:|---:|---:|---|---:|"]
    inside: list[str] = []
    for name in servers:
        for form in s["forms"]:
            f = _form(report, name, form)
            if f and "half_saturation" in f:
                h = f["half_saturation"]
                lat = h["latency_ms"]
                each = ", ".join(num(p, ".2f") for p in f.get("half_saturation_p99s_ms", [lat["p99"]]))
                lines.append(
                    f"| {name} | {form} | {num(h['target_rate_rps'])} | {num(lat['p50'], '.2f')} | "
                    f"{num(lat['p99'], '.2f')} | {each} | {_busy(h['loadgen_cpu_busy'])} |"
                )
                if v := h.get("server_side"):
                    inside.append(_server_side_row(name, form, v))
    if inside:
        lines += [
            "",
            "The same median step seen by the server's own histograms (a quantile is its bucket's upper bound: "
            'read it as "at most"). Handler: from the route\'s start to the answer encoded.',
            "",
            "| server | form | handler p50 ms | handler p99 ms | queue wait p99 ms | loop lag p99 ms (samples) "
            "| GC pauses (mean ms) | rows per batch |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *inside,
        ]
    heys = [
        (name, form, f["hey"])
        for name in servers
        for form in s["forms"]
        if (f := _form(report, name, form)) and "hey" in f
    ]
    if heys:
        lines += ["", "hey (Go, one body, closed loop) at the same point as this generator:", ""]
        lines += ["| server | form | c | hey req/s | ours req/s | ours ÷ hey |", "|---|---|---:|---:|---:|---:|"]
        for name, form, h in heys:
            lines.append(
                f"| {name} | {form} | {h['concurrency']} | {num(h['requests_per_s'])} | "
                f"{num(h['loadtest_requests_per_s'])} | {num(h.get('loadtest_over_hey'), '.3f')} |"
            )
    lines += ["", "Closed-loop ladder, req/s (generator busy):", ""]
    for name, r in servers.items():
        for form, f in r.get("forms", {}).items():
            steps = ", ".join(
                f"c{x['concurrency']} {num(x['throughput_rps'])} ({_busy(x['loadgen_cpu_busy'])})"
                for x in f["closed_loop"]
            )
            errors = sum(x["counts"]["errors"] for x in f["closed_loop"])
            lines.append(f"- {name} {form}: {steps}" + (f"; {errors} errors" if errors else ""))
    lines += ["", "Targets (issue 12 against a routed no-op; issue 26 against the raw one):", ""]
    for c in report["checks"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[c["met"]]
        lines.append(f"- {c['what']}: {num(c['value'], '.3g')} (target {c['target']}): {verdict}")
    lines += ["", "Commands:", ""]
    lines += [f"- {name}: `{r['command']}`" for name, r in servers.items()]
    first = next((f["closed_loop"][0] for r in servers.values() for f in r.get("forms", {}).values()), None)
    if first:
        lines.append(f"- a load step: `{first['command']}`")
    lines += [f"- hey: `{h['command']}`" for _, _, h in heys]
    lines.append(f"- this report: `{report['command']}`")
    if report["notes"]:
        lines += ["", "Notes:", "", *(f"- {n}" for n in report["notes"])]
    return "\n".join(lines) + "\n"
