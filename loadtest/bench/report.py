"""The benchmark's markdown table and throughput ratios, from its JSON report."""

from __future__ import annotations

from typing import Any

from loadtest.bench.pinning import core_list


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def ratios(servers: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    def sat(name: str) -> float | None:
        return servers.get(name, {}).get("saturation", {}).get("throughput_rps")

    out = {}
    for ours in ("eager", "cuda-graph", "cuda-graph-4w"):
        if sat(ours):
            # The ceiling of a server is the no-op server with as many workers.
            ceiling = "noop-4w" if ours.endswith("-4w") else "noop"
            out[f"{ours}_over_naive"] = ratio(sat(ours), sat("naive"))
            out[f"{ours}_over_ceiling"] = ratio(sat(ours), sat(ceiling))
            if ours.endswith("-4w"):
                out[f"{ours}_over_one_worker_ceiling"] = ratio(sat(ours), sat("noop"))
            elif sat("noop-lean"):  # the ceiling of the stack the service runs (a plain /predict route)
                out[f"{ours}_over_plain_route_ceiling"] = ratio(sat(ours), sat("noop-lean"))
    return out


def num(v: float | None, fmt: str = ",.0f") -> str:
    """A figure for a markdown cell: "–" where there is none."""
    return "–" if v is None else format(v, fmt)


def closed_loop_table(servers: dict[str, dict[str, Any]], concurrencies: list[int]) -> list[str]:
    """Markdown lines: each server's closed-loop req/s by requests in flight."""
    lines = ["", "Closed-loop throughput (req/s) by requests in flight:", ""]
    lines += ["| server | " + " | ".join(f"c{c}" for c in concurrencies) + " |", "|---|" + "---:|" * len(concurrencies)]
    for name, r in servers.items():
        if "closed_loop" in r:
            by_c = {x["concurrency"]: x for x in r["closed_loop"]}
            cells = [num(by_c[c]["throughput_rps"]) if c in by_c else "–" for c in concurrencies]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    m, pin, s = report["machine"], report["pinning"], report["settings"]
    servers, rat = report["servers"], report["ratios"]
    conc = s["concurrencies"]

    lines = [
        f"# Server benchmark — {report['started_at'][:10]}",
        "",
        f"{m['gpu'] or 'no GPU'} · {m['cpu_model'] or 'CPU'} ({m['cpu_count']} cores) · torch {m['torch']} · "
        f"servers on cores {core_list(pin['server_cores']) if pin['server_cores'] else 'unpinned'}, "
        f"load generator on {core_list(pin['loadgen_cores']) if pin['loadgen_cores'] else 'unpinned'} "
        f"({s['processes']} httpx processes) · {s['form']} form, {s['body_bytes_mean']:,.0f}-byte bodies, "
        f"1 image per request · each step {s['duration_s']:g} s after {s['warmup_s']:g} s warm-up.",
        "",
        "Saturation: the highest closed-loop throughput over "
        + "/".join(str(c) for c in conc)
        + " requests in flight. p99: open-loop Poisson arrivals at 50% / 90% of that server's own saturation, "
        "latency from the scheduled send time.",
        "",
        "| server | saturation req/s | at | ÷ naive | ÷ ceiling | p99 @ 50% (ms) | p99 @ 90% (ms) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in servers.items():
        if "skipped" in r or "error" in r:
            lines.append(f"| {name} | {r.get('skipped') or r.get('error')} |  |  |  |  |  |  |")
            continue
        sat = r["saturation"]
        p99 = {o["fraction_of_saturation"]: o for o in r["open_loop"]}

        def at(f: float, p99: dict[float, Any] = p99) -> str:
            o = p99.get(f)
            return "–" if o is None else f"{num(o['latency_ms']['p99'], '.2f')} ({num(o['target_rate_rps'])}/s)"

        errors = sum(x["counts"]["errors"] for x in r["closed_loop"] + r["open_loop"])
        naive = f"{rat[name + '_over_naive']:.2f}×" if rat.get(f"{name}_over_naive") else ""
        ceiling = f"{rat[name + '_over_ceiling']:.2f}" if rat.get(f"{name}_over_ceiling") else ""
        lines.append(
            f"| {name} ({r['role']}) | {num(sat['throughput_rps'])} | c{sat['concurrency']} | {naive} | {ceiling} "
            f"| {at(0.5)} | {at(0.9)} | {errors} |"
        )
    lines += closed_loop_table(servers, conc)
    heys = [r["hey"] | {"server": n} for n, r in servers.items() if "hey" in r]
    if heys:
        lines += ["", "Cross-check with hey (Go; one body, no answer checks), closed loop:", ""]
        lines += [
            f"- {h['server']} at c{h['concurrency']}: hey {num(h['requests_per_s'])} req/s, "
            f"this load generator {num(h['loadtest_requests_per_s'])} req/s"
            for h in heys
        ]
    lines += ["", "Commands:", ""]
    for name, r in servers.items():
        if "command" in r:
            lines.append(f"- {name}: `{r['command']}`")
            if r.get("closed_loop"):
                lines.append(f"  - load: `{r['closed_loop'][0]['command']}`")
    lines += [f"- hey ({h['server']}): `{h['command']}`" for h in heys]
    lines.append(f"- this report: `{report['command']}`")
    if report["notes"]:
        lines += ["", "Notes:", "", *(f"- {n}" for n in report["notes"])]
    return "\n".join(lines) + "\n"
