"""The tuner's result as settings: an env file (CGSERVE_BUCKETS, CGSERVE_MAX_DELAY_MS) that the
service reads as its `.env` and compose as `env_file`, the model.toml lines that set the same for
one model only, and a JSON report of everything measured and predicted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.tuning.choose import Choice, Timing


def env_lines(choice: Choice) -> list[str]:
    return [f"CGSERVE_BUCKETS={','.join(map(str, choice.buckets))}", f"CGSERVE_MAX_DELAY_MS={choice.max_delay_ms:g}"]


def toml_lines(choice: Choice) -> list[str]:
    return [f"buckets = [{', '.join(map(str, choice.buckets))}]", f"max_delay_ms = {choice.max_delay_ms:g}"]


def write_env_file(path: Path, choice: Choice, *, model: str, slo_ms: float) -> None:
    """The env file, its comments saying where the numbers came from."""
    header = [
        f"# cudagraph-serve tune --slo-p99-ms {slo_ms:g}: model {model}",
        f"# predicted: {choice.capacity_rps:,.0f} req/s sustainable with p99 ≤ {choice.worst_p99_ms:.2f} ms "
        "at every rate up to it (app/tuning/choose.py's model)",
        "# in a model.toml, the same for that model alone: " + "; ".join(toml_lines(choice)),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*header, *env_lines(choice)]) + "\n")


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
