"""The side-by-side benchmark's markdown (bench/side_by_side.py): the README's table, from its JSON."""

from __future__ import annotations

from typing import Any

from bench.harness.pinning import core_list
from bench.harness.report import closed_loop_table, num


def _saturation(record: dict[str, Any]) -> float | None:
    return record.get("saturation", {}).get("throughput_rps")


def markdown(report: dict[str, Any]) -> str:
    m, pin, s, servers = report["machine"], report["pinning"], report["settings"], report["servers"]
    rate, concurrencies = s["rate_rps"], s["concurrencies"]
    naive = _saturation(servers.get("naive", {}))
    server_cores = core_list(pin["server_cores"]) if pin["server_cores"] else "unpinned"
    loadgen_cores = core_list(pin["loadgen_cores"]) if pin["loadgen_cores"] else "unpinned"
    lines = [
        f"# Side by side — {report['model']}, {report['started_at'][:10]}",
        "",
        f"{m['gpu'] or 'no GPU'} · {m['cpu_model'] or 'CPU'} ({m['cpu_count']} cores) · torch {m['torch']} · "
        f"servers on cores {server_cores}, load generator on {loadgen_cores} ({s['processes']} processes) · "
        f"{s['form']} bodies of {s['body_bytes']:,} bytes, one image each"
        f"{', labels checked' if s['labels_checked'] else ''} · each step {s['duration_s']:g} s after "
        f"{s['warmup_s']:g} s warm-up · one run, servers one after another"
        + ("." if report["complete"] else " (stopped early: the servers below are those it finished)."),
        "",
        "Saturation: the highest error-free closed-loop throughput over "
        + "/".join(str(c) for c in concurrencies)
        + f" requests in flight. p50/p99: open-loop Poisson arrivals at {rate:g} req/s for every server, latency "
        "from the scheduled send time; 'no' where a server answered under 95% of the requests sent in "
        "the window, or with errors (its figures are then a growing queue's).",
        "",
        f"| server | what | saturation req/s | at | × naive | p50 @ {rate:g}/s (ms) | p99 @ {rate:g}/s (ms) "
        "| kept up | errors | ready (s) |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, r in servers.items():
        if "skipped" in r or "error" in r:
            lines.append(f"| {name} | {r['role']} | {r.get('skipped') or r.get('error')} |  |  |  |  |  |  |  |")
            continue
        sat, fixed = r["saturation"], r["open_loop"][0]
        errors = sum(x["counts"]["errors"] for x in r["closed_loop"] + r["open_loop"])
        over_naive = f"{sat['throughput_rps'] / naive:.2f}×" if naive else "–"
        lines.append(
            f"| {name} | {r['role']} | {num(sat['throughput_rps'])} | c{sat['concurrency']} | {over_naive} "
            f"| {num(fixed['latency_ms']['p50'], '.1f')} | {num(fixed['latency_ms']['p99'], '.1f')} "
            f"| {'yes' if fixed['kept_up'] else 'no'} | {errors} | {num(r.get('ready_s'), '.0f')} |"
        )
    lines += closed_loop_table(servers, concurrencies)
    lines += ["", "Commands:", ""]
    for name, r in servers.items():
        if "command" in r:
            lines.append(f"- {name}: `{r['command']}`")
    first = next((r for r in servers.values() if r.get("closed_loop")), None)
    if first:
        lines.append(f"- load (first step): `{first['closed_loop'][0]['command']}`")
    lines.append(f"- this report: `{report['command']}`")
    if report["notes"]:
        lines += ["", "Notes:", "", *(f"- {n}" for n in report["notes"])]
    return "\n".join(lines) + "\n"
