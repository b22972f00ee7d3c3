"""Markdown pieces the benchmarks' reports share."""

from __future__ import annotations

from typing import Any


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
