"""The engine process names itself (/proc/<pid>/comm): top, ps and the benchmarks tell it from the workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.engine_process.host import PROCESS_NAME


@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="Linux's /proc")
def test_the_engine_process_is_named_for_top_and_ps() -> None:
    code = (
        "from app.engine_process.host import PROCESS_NAME, name_this_process\n"
        "name_this_process(PROCESS_NAME)\n"
        "print(open('/proc/self/comm').read().strip())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == PROCESS_NAME == "cgserve-engines"
