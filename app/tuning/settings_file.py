"""The tuner's result as settings: its lines (CGSERVE_BUCKETS, CGSERVE_MAX_DELAY_MS) written into
the `.env` file that the service reads at start-up and compose hands the api (`env_file`), every
other line of it kept; the model.toml lines that set the same for one model only; and a JSON
report of everything measured and predicted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.tuning.choose import Choice, Timing


def env_lines(choice: Choice) -> list[str]:
    return [f"CGSERVE_BUCKETS={','.join(map(str, choice.buckets))}", f"CGSERVE_MAX_DELAY_MS={choice.max_delay_ms:g}"]


def toml_lines(choice: Choice) -> list[str]:
    return [f"buckets = [{', '.join(map(str, choice.buckets))}]", f"max_delay_ms = {choice.max_delay_ms:g}"]


TUNED = ("CGSERVE_BUCKETS", "CGSERVE_MAX_DELAY_MS")  # the settings the tuner chooses
_HEADER = ("# cudagraph-serve tune ", "# predicted: ", "# in a model.toml, the same for that model alone: ")


def write_env_file(path: Path, choice: Choice, *, model: str, slo_ms: float) -> None:
    """The tuned lines, with comments saying where the numbers came from, in place of any earlier
    ones in `path` (a previous run's, or the same settings set by hand); every other line kept."""
    header = [
        f"{_HEADER[0]}--slo-p99-ms {slo_ms:g}: model {model}",
        f"{_HEADER[1]}{choice.capacity_rps:,.0f} req/s sustainable with p99 ≤ {choice.worst_p99_ms:.2f} ms "
        "at every rate up to it (app/tuning/choose.py's model)",
        _HEADER[2] + "; ".join(toml_lines(choice)),
    ]
    kept = [line for line in (path.read_text().splitlines() if path.is_file() else []) if not _tuned(line)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*kept, *header, *env_lines(choice)]) + "\n")


def _tuned(line: str) -> bool:
    """A line the tuner writes: its comments, or an assignment of a setting it chooses."""
    name = line.strip().removeprefix("export ").partition("=")[0].strip()
    return line.startswith(_HEADER) or name in TUNED


def timing_ms(timing: Timing) -> dict[str, float]:
    return {"median_ms": round(timing.median_s * 1e3, 4), "p99_ms": round(timing.p99_s * 1e3, 4)}


def choice_json(choice: Choice | None) -> dict[str, Any] | None:
    if choice is None:
        return None
    return {
        "buckets": list(choice.buckets),
        "max_delay_ms": choice.max_delay_ms,
        "capacity_rps": round(choice.capacity_rps, 1),
        "p99_at_capacity_ms": round(choice.p99_at_capacity_ms, 3),
        "worst_p99_ms": round(choice.worst_p99_ms, 3),
        "bucket_at_capacity": choice.bucket_at_capacity,
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
