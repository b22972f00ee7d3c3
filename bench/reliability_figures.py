"""The reliability suite's speed and time figures, recorded rather than asserted.

tests/reliability holds what any machine must do under overload and hostile clients (every request
answered 200, 503 or 504; 431 and 408 for bad heads and stalled bodies; nothing starved or reset).
How fast is a figure of the machine: on a shared 2-core runner these measured 77–109 % of normal
throughput beside an attack from one run to the next. This runs those tests with
CGSERVE_FIGURES_OUT set, collects each figure they record (tests/reliability/common.py
record_figure) and writes them, with the command and the machine, to one JSON file.

    python bench/reliability_figures.py --out bench/results/reliability-figures.json

Figures: overload (capacity_rps, offered and achieved rate, 503 p50/p99 ms, slowest answer ms),
each attack's share of normal throughput (issue 11's target: ≥ 0.8) and the slowest
server-closed slowloris connection (s), the body timeout's wait (s) against its 1 s setting, and how
long a server with a hung batch takes to exit (s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/reliability/test_overload.py",
    "tests/reliability/test_hostile_clients.py",
    "tests/reliability/test_body_pauses.py",
    "tests/reliability/test_dead_device.py",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    parser.add_argument("tests", nargs="*", default=TESTS, help="test files or ids (default: the three above)")
    args = parser.parse_args()
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-q", "-s", *args.tests]
    with tempfile.TemporaryDirectory() as scratch:
        lines = Path(scratch) / "figures.jsonl"
        started = time.time()
        done = subprocess.run(command, cwd=ROOT, env=os.environ | {"CGSERVE_FIGURES_OUT": str(lines)}, check=False)
        figures = [json.loads(line) for line in lines.read_text().splitlines()] if lines.exists() else []
    record = {
        "command": " ".join(["python", "bench/reliability_figures.py", *sys.argv[1:]]),
        "pytest": " ".join(command[1:]),
        "pytest_exit_code": done.returncode,  # the behavioural assertions: 0 when all held
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "figures": figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{len(figures)} figures → {args.out}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
