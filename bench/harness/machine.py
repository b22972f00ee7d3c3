"""What a benchmark ran on: hardware, library versions and the commit, for its record."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    import fastapi
    import httpx
    import torch
    import uvicorn

    # The first processor's fields. A virtual machine's "model name" may be only "Intel(R) Xeon(R) Processor", so its
    # family and model numbers go beside it: run 51's two H100 hosts differed there alone (model 207 and 143).
    cpuinfo: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            cpuinfo.setdefault(key.strip(), value.strip())
    cpu_model = cpuinfo.get("model name", "")
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cpu_family_model": f"{cpuinfo.get('cpu family', '?')}/{cpuinfo.get('model', '?')}",
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "httpx": httpx.__version__,
    }
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5)
        info["git_commit"] = commit.stdout.strip() if commit.returncode == 0 else None
        info["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info
